//! The floor under a registrar benchmark: a server that answers every ASAP_REGISTRATION and
//! ASAP_HANDLE_RESOLUTION with a fixed, pre-encoded response (a handle resolution gets three
//! PEs, as a registrar's default), without decoding or a handlespace. What it sustains under
//! `rserpool bench` is what the transport and the kernel allow a registrar on this machine;
//! `scripts/bench-registrar` runs it beside the registrars it compares.
//!
//! Usage: `asap_echo [sctp|tcp] [ADDR:PORT]` (default: sctp 127.0.0.1:3863).

use bytes::Bytes;
use rserpool_transport::{AssociationId, Endpoint, EndpointConfig, Event, TransportChoice};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::net::SocketAddr;
use std::time::Duration;

/// ASAP message types answered (RFC 5352 §2.2).
const REGISTRATION: u8 = 0x01;
const HANDLE_RESOLUTION: u8 = 0x05;

fn responses() -> (Bytes, Bytes) {
    let codec = Codec::default();
    let pool = PoolHandle::from("BenchPool");
    let pe = |i: u32| PoolElement {
        id: PoolElementId(i),
        home_registrar: RegistrarId(1),
        registration_life: RegistrationLife::Finite(Duration::from_secs(600)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            10_000 + i as u16,
            TransportUse::DataPlusControl,
            vec!["10.255.0.1".parse().expect("address")],
        )),
        policy: PoolPolicy::RoundRobin,
        asap_transport: None,
    };
    let registration = AsapMessage::RegistrationResponse(asap::RegistrationResponse {
        reject: false,
        pool_handle: pool.clone(),
        pe_id: PoolElementId(1),
        error: None,
    });
    let resolution = AsapMessage::HandleResolutionResponse(asap::HandleResolutionResponse {
        accepted: false,
        pool_handle: pool,
        overall_policy: Some(PoolPolicy::RoundRobin),
        pool_elements: vec![pe(1), pe(2), pe(3)],
        error: None,
    });
    let encode = |m| Bytes::from(codec.encode(m).expect("valid response"));
    (encode(&registration), encode(&resolution))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let transport = match args.next().as_deref() {
        None | Some("sctp") => TransportChoice::Sctp,
        Some("tcp") => TransportChoice::Tcp,
        Some(other) => return Err(format!("transport {other:?}: expected sctp or tcp").into()),
    };
    let listen: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:3863".into())
        .parse()?;
    let (registration, resolution) = responses();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut config = EndpointConfig::new(transport);
        config.local_addrs = vec![listen];
        config.accept = true;
        let mut endpoint = Endpoint::bind(config).await?;
        let handle = endpoint.handle();
        let mut out: Vec<(AssociationId, Bytes)> = Vec::new();
        let mut last = rustc_hash::FxHashMap::default();
        // Like the registrar's driver: take what is queued, then answer, each association's
        // answers but the last with the hint that more follow.
        while let Some(first) = endpoint.next_event().await {
            let mut event = Some(first);
            while let Some(e) = event {
                if let Event::Message { id, data, .. } = e {
                    match data.first() {
                        Some(&REGISTRATION) => out.push((id, registration.clone())),
                        Some(&HANDLE_RESOLUTION) => out.push((id, resolution.clone())),
                        _ => {}
                    }
                }
                event = endpoint.try_next_event();
            }
            last.clear();
            for (i, (id, _)) in out.iter().enumerate() {
                last.insert(*id, i);
            }
            for (i, (id, answer)) in out.drain(..).enumerate() {
                // A full queue drops the answer (the load generator counts what arrives); the
                // next answer to that association flushes what was held.
                let more = last.get(&id) != Some(&i);
                let _ = handle.try_send_hinted(id, 11, 0, answer, more).await;
            }
        }
        Ok(())
    })
}
