//! `rserpool`: the command-line entry point of the project.

/// `println!` for command output: when stdout is a closed pipe (`rserpool decode | head`) the
/// program ends quietly with success, as Unix tools do, instead of panicking.
macro_rules! outln {
    () => {
        $crate::print_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

mod bench;
mod csp;
mod decode;
mod demo;
mod dump;
mod monitor;
mod pe;
mod pu;
#[cfg(test)]
mod reference;
mod registrar;
mod resolve;
mod tls;
mod units;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// Reliable Server Pooling (RFC 5351–5356) in Rust.
#[derive(Parser)]
#[command(name = "rserpool", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `rserpool_registrar=debug`.
    /// Also read from RUST_LOG. [default: info for daemons, warn for tools]
    #[arg(long, global = true, env = "RUST_LOG")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the whole system on loopback: registrars over ENRP, PingPong PEs, pool users
    /// with failover, the LSNAT gateway; a PE and a registrar crash (no arguments needed).
    Demo(demo::DemoArgs),
    /// Run a registrar: ASAP for pool elements and pool users.
    Registrar(Box<registrar::RegistrarArgs>),
    /// Run the LSNAT gateway: one virtual address in front of a pool (RFC 2391).
    Lsnat(Box<rserpool_lsnat::LsnatArgs>),
    /// Resolve a pool handle at a registrar and print the PEs selected and why.
    Resolve(resolve::ResolveArgs),
    /// Print a registrar's handlespace, read over ENRP as a peer (like RSPLIB's hsdump).
    Dump(Box<dump::DumpArgs>),
    /// Decode the ASAP and ENRP messages of a pcap file (default: a bundled RSPLIB capture).
    Decode(decode::DecodeArgs),
    /// Load a registrar (rserpool's or RSPLIB's) with handle resolutions and registrations.
    Bench(bench::BenchArgs),
    /// Run a pool element serving echo, discard, daytime, chargen, pingpong or calcapp.
    Pe(Box<pe::PeArgs>),
    /// Use a pool: lines to an echo pool, or the pingpong/calcapp client, with failover.
    Pu(Box<pu::PuArgs>),
    /// Watch registrars, pools, PEs and sessions live: status endpoints and CSP reports.
    Monitor(Box<monitor::MonitorArgs>),
}

/// Writes one line to stdout; on a closed pipe exits with success and without a word, on any
/// other write error exits with failure and says why.
pub(crate) fn print_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("rserpool: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// An error and its causes on one line, each cause once: an error that already quotes its cause
/// (as many do, "cannot bind ADDR: Address already in use") is not followed by it again.
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Resolves when SIGINT or SIGTERM arrives.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The command line, with negative numbers let through to the value parsers: `--max-eu-rate -3`
/// is then refused naming the flag and the value, not as "unexpected argument '-3'".
fn parse_command_line() -> Cli {
    let command = Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|arg| {
            if arg.get_action().takes_values() && !arg.is_positional() {
                arg.allow_negative_numbers(true)
            } else {
                arg
            }
        })
    });
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    let cli = parse_command_line();
    let daemon = match &cli.command {
        Command::Registrar(a) => !a.check,
        Command::Lsnat(a) => !a.check,
        Command::Pe(a) => !a.check,
        _ => false,
    };
    let log = cli
        .log
        .clone()
        .unwrap_or_else(|| match (&cli.command, daemon) {
            // The demo crashes things on purpose: the warnings that follow are its story,
            // told on stdout.
            (Command::Demo(_), _) => "error".to_string(),
            (_, true) => "info".to_string(),
            _ => "warn".to_string(),
        });
    let filter = tracing_subscriber::EnvFilter::try_new(&log).unwrap_or_else(|e| {
        eprintln!("rserpool: --log {log:?}: {e}; using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Demo(args) => demo::demo(args),
        Command::Registrar(args) => registrar::run_registrar(*args),
        Command::Lsnat(args) => rserpool_lsnat::run(&args),
        Command::Resolve(args) => resolve::run(args),
        Command::Dump(args) => dump::run(*args),
        Command::Decode(args) => decode::run(&args),
        Command::Bench(args) => bench::run(args),
        Command::Pe(args) => pe::run(*args),
        Command::Pu(args) => pu::run(*args),
        Command::Monitor(args) => monitor::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rserpool: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once() {
        #[derive(Debug)]
        struct Bind(std::io::Error);
        impl std::fmt::Display for Bind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot bind 127.0.0.1:3863: {}", self.0)
            }
        }
        impl std::error::Error for Bind {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let e = anyhow::Error::new(Bind(io)).context("registrar");
        let text = describe(&e);
        assert_eq!(text.matches("address in use").count(), 1, "{text}");
        assert!(
            text.starts_with("registrar: cannot bind 127.0.0.1:3863: "),
            "{text}"
        );
    }
}
