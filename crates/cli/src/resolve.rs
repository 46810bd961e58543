//! `rserpool resolve POOL --registrar ADDR`: asks a registrar for PEs of a pool and prints them
//! with the policy values the selection was based on. A selection, not a reachability check.

use crate::units::DurationValue;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use rserpool_endpoint::driver::{PoolUserClient, RegistrarAccess};
use rserpool_endpoint::pu::{ResolveError, ResolverConfig};
use rserpool_transport::TransportChoice;
use rserpool_transport::{Endpoint, EndpointConfig, Event};
use rserpool_wire::{CodecConfig, LifeUnit, PoolHandle};
use std::net::SocketAddr;
use std::time::Duration;

/// Why the registrar at `addr` cannot be reached over `choice`, as the transport reports it
/// (e.g. "connection refused"), with the transport actually tried.
async fn why_unreachable(
    addr: SocketAddr,
    choice: TransportChoice,
    tls: Option<rserpool_transport::TlsSettings>,
) -> String {
    let mut config = EndpointConfig::new(choice);
    config.tls = tls;
    let mut endpoint = match Endpoint::bind(config).await {
        Ok(e) => e,
        Err(e) => return format!("{addr}: {e}"),
    };
    let kind = endpoint.kind();
    let id = match endpoint.handle().connect(&[addr]).await {
        Ok(id) => id,
        Err(e) => return format!("{addr} over {kind}: {e}"),
    };
    let reason = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match endpoint.next_event().await {
                Some(Event::AssociationUp { id: up, .. }) if up == id => {
                    break "reachable now, but it did not answer".to_string()
                }
                Some(Event::AssociationDown { reason, .. }) => break reason.to_string(),
                Some(_) => {}
                None => break "the transport closed".to_string(),
            }
        }
    })
    .await
    .unwrap_or_else(|_| "no answer to the connection attempt".to_string());
    endpoint.shutdown();
    format!("{addr} over {kind}: {reason}")
}

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
    /// How long to wait for the answer, e.g. "3s" (a bare number is read in milliseconds, with
    /// a deprecation warning).
    #[arg(long, default_value = "3s", value_name = "DURATION")]
    timeout: DurationValue,
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
    if let Some(w) = args.timeout.deprecation("--timeout") {
        tracing::warn!("{w}");
    }
    let timeout = args.timeout.duration;
    let codec = CodecConfig {
        registration_life_unit: if args.life_unit == "s" {
            LifeUnit::Seconds
        } else {
            LifeUnit::Milliseconds
        },
        ..CodecConfig::default()
    };
    if args.pool.len() > codec.max_pool_handle_size {
        bail!(
            "pool handle of {} bytes exceeds the limit of {} bytes (a registrar refuses it)",
            args.pool.len(),
            codec.max_pool_handle_size
        );
    }
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
        access.endpoint.tls = tls.clone();
        let client = PoolUserClient::start(
            ResolverConfig {
                items,
                response_timeout: timeout,
                codec,
                ..ResolverConfig::default()
            },
            access,
        )
        .await?;
        let pool = PoolHandle::from(args.pool.as_str());
        let r = tokio::time::timeout(
            timeout + Duration::from_secs(8),
            client.resolve(pool.clone()),
        )
        .await
        .map_err(|_| anyhow!("no registrar of {:?} answered", args.registrar))?;
        let r = match r {
            Ok(r) => r,
            Err(ResolveError::NoRegistrar) => {
                let mut why = Vec::new();
                for a in &args.registrar {
                    why.push(why_unreachable(*a, transport, tls.clone()).await);
                }
                bail!(
                    "no registrar could be reached{}: {}",
                    if args.tls.given() { " with TLS" } else { "" },
                    why.join("; ")
                )
            }
            Err(e) => bail!("pool {pool}: {e}"),
        };
        outln!(
            "pool {}: {} PE(s) selected by the registrar{}",
            r.pool_handle,
            r.pool_elements.len(),
            r.policy
                .as_ref()
                .map(|p| format!(", policy {}", p.policy_type()))
                .unwrap_or_default()
        );
        for (i, pe) in r.pool_elements.iter().enumerate() {
            outln!(
                "  {}. PE {} home registrar {}: {} — {}",
                i + 1,
                pe.id,
                pe.home_registrar,
                pe.user_transport,
                pe.policy
            );
        }
        outln!("(selected, not checked: the PEs were not contacted)");
        Ok(())
    })
}
