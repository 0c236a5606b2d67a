//! The command line, parsed by hand: `--addr <ip:port>` and `--unsafe-no-lock`.

use std::net::SocketAddr;

/// What `--help` prints, and what follows every command-line error.
pub const USAGE: &str = "\
usage: payments [--addr <ip:port>] [--unsafe-no-lock]

  --addr <ip:port>   where to listen (default 127.0.0.1:3000; port 0 picks a free one)
  --unsafe-no-lock   skip the per-account lock, to see updates get lost
  -h, --help         print this and exit";

/// The address used without `--addr`.
pub const DEFAULT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 3000);

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Serve on `addr`; lock each account around its read-modify-write unless `lock` is false.
    Serve { addr: SocketAddr, lock: bool },
    /// Print the usage and exit.
    Help,
}

/// Parses the arguments after the program name; the error says which one is wrong and why.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut addr = DEFAULT_ADDR;
    let mut lock = true;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => {
                let value = args
                    .next()
                    .ok_or("--addr needs a value, e.g. --addr 127.0.0.1:3000")?;
                addr = parse_addr(&value)?;
            }
            "--unsafe-no-lock" => lock = false,
            "-h" | "--help" => return Ok(Command::Help),
            other => match other.strip_prefix("--addr=") {
                Some(value) => addr = parse_addr(value)?,
                None => return Err(format!("unknown argument {other:?}")),
            },
        }
    }
    Ok(Command::Serve { addr, lock })
}

fn parse_addr(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| {
        format!("--addr {value:?} is not an ip:port address, e.g. 127.0.0.1:3000 or [::1]:0")
    })
}
