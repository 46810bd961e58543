//! `rserpool resolve POOL --registrar ADDR`: asks a registrar for PEs of a pool and prints them
//! with the policy values the selection was based on. A selection, not a reachability check.

use anyhow::{anyhow, bail, Result};
use clap::Args;
use rserpool_endpoint::driver::{PoolUserClient, RegistrarAccess};
use rserpool_endpoint::pu::{ResolveError, ResolverConfig};
use rserpool_transport::TransportChoice;
use rserpool_wire::{CodecConfig, LifeUnit, PoolHandle};
use std::net::SocketAddr;
use std::time::Duration;

/// Options of `rserpool resolve`.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    /// The pool handle.
    pool: String,
    /// Registrar to ask (repeat to give alternatives, tried in order).
    #[arg(long, required = true, value_name = "ADDR:PORT")]
    registrar: Vec<SocketAddr>,
    /// Transport: auto, sctp or tcp (the TCP mapping).
    #[arg(long, default_value = "auto", value_parser = ["auto", "sctp", "tcp"])]
    transport: String,
    /// PEs to ask for (Handle Resolution option); 0 = the registrar's default, `all` = as many
    /// as it gives.
    #[arg(long, default_value = "0")]
    items: String,
    /// How long to wait for the answer, in ms.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    timeout: u64,
    /// Registration Life unit of the registrar: ms (RSPLIB) or s (RFC text).
    #[arg(long, default_value = "ms", value_parser = ["ms", "s"])]
    life_unit: String,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
}

/// Runs `rserpool resolve`.
pub fn run(args: ResolveArgs) -> Result<()> {
    let items = match args.items.as_str() {
        "all" => Some(u32::MAX),
        "0" => None,
        n => Some(
            n.parse::<u32>()
                .map_err(|e| anyhow!("--items {n:?}: {e} (a number or `all`)"))?,
        ),
    };
    let transport = match args.transport.as_str() {
        "sctp" => TransportChoice::Sctp,
        "tcp" => TransportChoice::Tcp,
        _ => TransportChoice::Auto,
    };
    if args.pool.is_empty() {
        bail!("the pool handle must not be empty");
    }
    let codec = CodecConfig {
        registration_life_unit: if args.life_unit == "s" {
            LifeUnit::Seconds
        } else {
            LifeUnit::Milliseconds
        },
        ..CodecConfig::default()
    };
    let tls = args.tls.settings()?;
    if tls.is_some() && transport == TransportChoice::Sctp {
        bail!(
            "--transport sctp: {}",
            rserpool_transport::TlsError::OverSctp
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut access = RegistrarAccess::single(args.registrar[0], transport);
        access.registrars = args.registrar.iter().map(|a| vec![*a]).collect();
        access.endpoint.tls = tls;
        let client = PoolUserClient::start(
            ResolverConfig {
                items,
                response_timeout: Duration::from_millis(args.timeout),
                codec,
                ..ResolverConfig::default()
            },
            access,
        )
        .await?;
        let pool = PoolHandle::from(args.pool.as_str());
        let r = tokio::time::timeout(
            Duration::from_millis(args.timeout + 8000),
            client.resolve(pool.clone()),
        )
        .await
        .map_err(|_| anyhow!("no registrar of {:?} answered", args.registrar))?
        .map_err(|e| match e {
            ResolveError::NoRegistrar => {
                anyhow!(
                    "no registrar of {:?} could be reached over {}{}",
                    args.registrar,
                    args.transport,
                    if args.tls.given() { " with TLS" } else { "" }
                )
            }
            e => anyhow!("pool {pool}: {e}"),
        })?;
        println!(
            "pool {}: {} PE(s) selected by the registrar{}",
            r.pool_handle,
            r.pool_elements.len(),
            r.policy
                .as_ref()
                .map(|p| format!(", policy {}", p.policy_type()))
                .unwrap_or_default()
        );
        for (i, pe) in r.pool_elements.iter().enumerate() {
            println!(
                "  {}. PE {} home registrar {}: {} — {}",
                i + 1,
                pe.id,
                pe.home_registrar,
                pe.user_transport,
                pe.policy
            );
        }
        println!("(selected, not checked: the PEs were not contacted)");
        Ok(())
    })
}
