//! The command line of the measurement programs (`profile_*.rs`, `bench_report.rs`): their own
//! flags, parsed by clap, and what cargo's runners pass them, taken as criterion takes it.
//!
//! `cargo bench --bench NAME -- FLAGS` runs a program with its flags, then `--bench`. Plain
//! `cargo bench` runs every benchmark, these programs among them, with `--bench` alone, and
//! `cargo bench -- hot` passes `hot` before it: a name that picks the benchmarks containing it.
//! `cargo test --benches` runs them once without `--bench` (a profiler runs its workload,
//! `bench_report` does nothing), with the names and libtest flags given after its `--`. So each
//! program also takes `--bench`, names, `--nocapture` and `--show-output`, hidden from its
//! `--help`, and runs only if no name was given or one is part of its own; any other argument
//! is an error.

use clap::Parser;

/// The program's name: its bench target's.
const PROGRAM: &str = env!("CARGO_CRATE_NAME");

/// What cargo's runners pass, next to a program's own flags (`#[command(flatten)]`).
#[derive(Debug, clap::Args)]
pub struct Runner {
    /// Given by `cargo bench`, not by `cargo test --benches`.
    #[arg(long, hide = true)]
    pub bench: bool,
    /// Names that pick benchmarks by a part of theirs (`cargo bench -- hot`).
    #[arg(hide = true)]
    names: Vec<String>,
    /// libtest's output flags (`cargo test --benches -- --nocapture`): accepted, ignored.
    #[arg(long, hide = true)]
    nocapture: bool,
    #[arg(long, hide = true)]
    show_output: bool,
}

impl Runner {
    /// Whether the names given, if any, pick this program.
    pub fn picks_this_program(&self) -> bool {
        let picks = |name: &String| PROGRAM.contains(name.as_str());
        self.names.is_empty() || self.names.iter().any(picks)
    }
}

/// Parses the command line. A usage error prints clap's message and exits with code 1, as
/// every other error of these programs does (clap's own code is 2); `--help` prints the help
/// and exits 0.
pub fn parse<Cli: Parser>() -> Cli {
    // Named after the target: the binary cargo builds is `NAME-HASH`.
    let matches = Cli::command().bin_name(PROGRAM).try_get_matches();
    matches
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .unwrap_or_else(|error| {
            let code = if error.use_stderr() { 1 } else { 0 };
            let _ = error.print();
            std::process::exit(code)
        })
}
