//! The registrar core alone (no sockets): decoding, handling and answering ASAP_REGISTRATION
//! (re-registrations in a pool of 1 000 PEs) and ASAP_HANDLE_RESOLUTION (3 PEs of 1 000), the
//! user-space share of what `rserpool bench` measures over real transports.
//! Run: `cargo bench -p rserpool-registrar --bench core`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rserpool_registrar::{
    AssociationId, AssociationKind, PeerInfo, Profile, Registrar, RegistrarConfig,
};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::time::Duration;

const PES: u32 = 1000;

fn registration(i: u32) -> AsapMessage {
    AsapMessage::Registration(asap::Registration {
        pool_handle: PoolHandle::from("BenchPool"),
        pool_element: PoolElement {
            id: PoolElementId(0x1000_0000 + i),
            home_registrar: RegistrarId(0),
            registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
            user_transport: UserTransport::Address(TransportAddress::sctp(
                10_000 + i as u16,
                TransportUse::DataPlusControl,
                vec!["10.255.0.1".parse().unwrap()],
            )),
            policy: PoolPolicy::RoundRobin,
            asap_transport: None,
        },
    })
}

fn bench(c: &mut Criterion) {
    let codec = Codec::default();
    let mut config = RegistrarConfig::new(Profile::Rsplib);
    config.seed = Some(1);
    config.announce = None;
    config.keep_alive_interval = Duration::from_secs(3600);
    // As the driver runs it unless debug logs are on: resolutions counted, not reported.
    config.report_resolutions = false;
    let mut r = Registrar::new(config, Duration::ZERO);
    let a = AssociationId(1);
    r.association_up(
        Duration::ZERO,
        a,
        PeerInfo {
            kind: AssociationKind::Sctp,
            addresses: vec!["10.255.0.1".parse().unwrap(), "127.0.0.1".parse().unwrap()],
            port: 5000,
        },
    );
    let registrations: Vec<Vec<u8>> = (0..PES)
        .map(|i| codec.encode(&registration(i)).unwrap())
        .collect();
    for b in &registrations {
        r.message(Duration::ZERO, a, 11, b);
    }
    while r.poll_transmit().is_some() {}
    while r.poll_event().is_some() {}
    assert_eq!(r.handlespace().len(), PES as usize);
    let resolution = codec
        .encode(&AsapMessage::HandleResolution(asap::HandleResolution {
            subscribe: false,
            pool_handle: PoolHandle::from("BenchPool"),
            option: None,
        }))
        .unwrap();

    let mut g = c.benchmark_group("registrar_core_1000_pes");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("reregistration", |b| {
        b.iter(|| {
            r.message(
                Duration::ZERO,
                a,
                11,
                &registrations[i % registrations.len()],
            );
            i += 1;
            while r.poll_transmit().is_some() {}
            while r.poll_event().is_some() {}
        })
    });
    g.bench_function("handle_resolution_3_items", |b| {
        b.iter(|| {
            r.message(Duration::ZERO, a, 11, &resolution);
            while r.poll_transmit().is_some() {}
            while r.poll_event().is_some() {}
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
