//! The command line: `--addr <ip:port>`, `--unsafe-no-lock`, `--work-ms <ms>` and
//! `--journal <events>`, parsed by clap (`--help`).

use std::net::SocketAddr;

use clap::builder::RangedU64ValueParser;

/// The address used without `--addr`.
const DEFAULT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 3000);

/// A payments service: credits and debits of accounts over HTTP, one read-modify-write per
/// account at a time.
#[derive(Debug, clap::Parser)]
#[command(args_override_self = true)]
pub struct Cli {
    /// Where to listen (port 0 picks a free one)
    #[arg(long, value_name = "ip:port", default_value_t = DEFAULT_ADDR, value_parser = parse_addr)]
    pub addr: SocketAddr,
    /// Skip the per-account lock, to see updates get lost
    #[arg(long)]
    pub unsafe_no_lock: bool,
    /// Hold each account's lock this long in every credit and debit, as a call to a payment
    /// provider would (0: no such call)
    #[arg(long, value_name = "ms", default_value_t = 0, value_parser = clap::value_parser!(u64).range(..=MAX_WORK_MS))]
    pub work_ms: u64,
    /// Keep the lock registry's last <events> events, for the timeline at /locks/page
    #[arg(long, value_name = "events", value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_JOURNAL))]
    pub journal: Option<usize>,
}

/// The longest `--work-ms`: a minute, well past the stall warning at one second.
const MAX_WORK_MS: u64 = 60_000;

/// The most events `--journal` keeps: a bound, so that a slip of the keyboard cannot ask for
/// every byte of memory.
const MAX_JOURNAL: u64 = 1_000_000;

fn parse_addr(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| "not an ip:port address, e.g. 127.0.0.1:3000 or [::1]:0".to_owned())
}
