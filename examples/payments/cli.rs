//! The command line: `--addr <ip:port>` and `--unsafe-no-lock`, parsed by clap (`--help`).

use std::net::SocketAddr;

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
}

fn parse_addr(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| "not an ip:port address, e.g. 127.0.0.1:3000 or [::1]:0".to_owned())
}
