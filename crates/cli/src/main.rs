//! `rserpool`: the command-line entry point of the project.

mod bench;
mod decode;
mod demo;
mod registrar;
mod resolve;
mod tls;

use clap::{Parser, Subcommand};
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
    /// Show what rserpool does on a built-in example (no arguments needed).
    Demo,
    /// Run a registrar: ASAP for pool elements and pool users.
    Registrar(Box<registrar::RegistrarArgs>),
    /// Run the LSNAT gateway: one virtual address in front of a pool (RFC 2391).
    Lsnat(Box<rserpool_lsnat::LsnatArgs>),
    /// Resolve a pool handle at a registrar and print the PEs selected and why.
    Resolve(resolve::ResolveArgs),
    /// Decode the ASAP and ENRP messages of a pcap file (default: a bundled RSPLIB capture).
    Decode(decode::DecodeArgs),
    /// Load a registrar (rserpool's or RSPLIB's) with handle resolutions and registrations.
    Bench(bench::BenchArgs),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let daemon = matches!(cli.command, Command::Registrar(_) | Command::Lsnat(_));
    let log = cli
        .log
        .clone()
        .unwrap_or_else(|| if daemon { "info" } else { "warn" }.to_string());
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
        Command::Demo => demo::demo(),
        Command::Registrar(args) => registrar::run_registrar(*args),
        Command::Lsnat(args) => rserpool_lsnat::run(&args),
        Command::Resolve(args) => resolve::run(args),
        Command::Decode(args) => decode::run(&args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rserpool: {e:#}");
            ExitCode::FAILURE
        }
    }
}
