//! `rserpool`: the command-line entry point of the project.

mod decode;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Reliable Server Pooling (RFC 5351–5356) in Rust.
#[derive(Parser)]
#[command(name = "rserpool", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what rserpool does on a built-in example (no arguments needed).
    Demo,
    /// Decode the ASAP and ENRP messages of a pcap file (default: a bundled RSPLIB capture).
    Decode(decode::DecodeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => decode::demo(),
        Command::Decode(args) => decode::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rserpool: {e:#}");
            ExitCode::FAILURE
        }
    }
}
