//! `rserpool decode`: prints the ASAP and ENRP messages of a capture, decoded by rserpool-wire.

use anyhow::{Context, Result};
use clap::Args;
use rserpool_wire::capture::read_pcap;
use rserpool_wire::{AsapMessage, Codec, CodecConfig, EnrpMessage, LifeUnit, Protocol};
use std::path::PathBuf;

/// A capture of RSPLIB 3.4.4 traffic (registration, keep-alives, handle resolution, ENRP).
const BUNDLED_CAPTURE: &[u8] = include_bytes!("../../wire/tests/data/rsplib-asap-enrp.pcap");

/// Options of `rserpool decode`.
#[derive(Args)]
pub struct DecodeArgs {
    /// pcap file to read (pcapng: convert with `editcap -F pcap`). Default: the bundled capture.
    file: Option<PathBuf>,
    /// Unit of the Registration Life field: ms (RSPLIB, Wireshark) or s (RFC 5354 text).
    #[arg(long, default_value = "ms", value_parser = ["ms", "s"])]
    life_unit: String,
    /// Print every field of each message (Rust's debug layout) instead of one line.
    #[arg(long, short)]
    verbose: bool,
    /// Print each message's bytes in hex too.
    #[arg(long)]
    hex: bool,
    /// Also write each message's bytes into DIR as `asap-FRAME-N` / `enrp-FRAME-N` (e.g. to seed
    /// the fuzzers).
    #[arg(long, value_name = "DIR")]
    extract: Option<PathBuf>,
}

/// Runs `rserpool decode`.
pub fn run(args: &DecodeArgs) -> Result<()> {
    let data = match &args.file {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        None => BUNDLED_CAPTURE.to_vec(),
    };
    let name = args
        .file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "bundled RSPLIB capture".into());
    let messages = read_pcap(&data).with_context(|| format!("reading {name}"))?;
    let codec = Codec::new(CodecConfig {
        registration_life_unit: if args.life_unit == "s" {
            LifeUnit::Seconds
        } else {
            LifeUnit::Milliseconds
        },
        ..CodecConfig::default()
    });
    if let Some(dir) = &args.extract {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let (mut ok, mut bad) = (0usize, 0usize);
    for (i, m) in messages.iter().enumerate() {
        if let Some(dir) = &args.extract {
            let proto = match m.protocol {
                Protocol::Asap => "asap",
                Protocol::Enrp => "enrp",
            };
            let path = dir.join(format!("{proto}-{}-{i}", m.frame));
            std::fs::write(&path, &m.bytes)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let decoded = match m.protocol {
            Protocol::Asap => codec.decode::<AsapMessage>(&m.bytes).map(|d| {
                if args.verbose {
                    format!("{:#?}", d.message)
                } else {
                    d.message.to_string()
                }
            }),
            Protocol::Enrp => codec.decode::<EnrpMessage>(&m.bytes).map(|d| {
                if args.verbose {
                    format!("{:#?}", d.message)
                } else {
                    d.message.to_string()
                }
            }),
        };
        outln!(
            "frame {} {} -> {} ({}, {} bytes)",
            m.frame,
            m.source,
            m.destination,
            m.transport,
            m.bytes.len()
        );
        if args.hex {
            let hex: String = m.bytes.iter().map(|b| format!("{b:02x}")).collect();
            outln!("  {hex}");
        }
        match decoded {
            Ok(text) => {
                ok += 1;
                for line in text.lines() {
                    outln!("  {line}");
                }
            }
            Err(e) => {
                bad += 1;
                outln!("  error: {e}");
            }
        }
    }
    outln!("\n{name}: {ok} messages decoded, {bad} with errors");
    if bad > 0 {
        anyhow::bail!("{bad} of {} messages did not decode", messages.len());
    }
    Ok(())
}
