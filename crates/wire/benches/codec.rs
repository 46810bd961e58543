//! Decode and encode speed of the two messages a registrar handles most: ASAP_REGISTRATION and a
//! HANDLE_RESOLUTION_RESPONSE carrying 3 PEs. Run: `cargo bench -p rserpool-wire`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::hint::black_box;
use std::time::Duration;

fn pe(i: u32) -> PoolElement {
    PoolElement {
        id: PoolElementId(0x2b95_38f0 + i),
        home_registrar: RegistrarId(0x1dee_a448),
        registration_life: RegistrationLife::Finite(Duration::from_millis(90_000)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            59_154,
            TransportUse::DataPlusControl,
            vec!["10.255.0.1".parse().unwrap()],
        )),
        policy: PoolPolicy::RoundRobin,
        asap_transport: Some(TransportAddress::sctp(
            35_191,
            TransportUse::DataOnly,
            vec![
                "127.0.0.1".parse().unwrap(),
                "::1".parse().unwrap(),
                "10.255.0.1".parse().unwrap(),
            ],
        )),
    }
}

fn bench(c: &mut Criterion) {
    let codec = Codec::default();
    let registration = AsapMessage::Registration(asap::Registration {
        pool_handle: PoolHandle::from("EchoPool"),
        pool_element: PoolElement {
            asap_transport: None,
            home_registrar: RegistrarId(0),
            ..pe(0)
        },
    });
    let response = AsapMessage::HandleResolutionResponse(asap::HandleResolutionResponse {
        accepted: false,
        pool_handle: PoolHandle::from("EchoPool"),
        overall_policy: Some(PoolPolicy::RoundRobin),
        pool_elements: (0..3).map(pe).collect(),
        error: None,
    });
    for (name, msg) in [
        ("registration", &registration),
        ("handle_resolution_response_3pe", &response),
    ] {
        let bytes = codec.encode(msg).unwrap();
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(1));
        g.bench_function("decode", |b| {
            b.iter(|| codec.decode::<AsapMessage>(black_box(&bytes)).unwrap())
        });
        let mut buf = Vec::with_capacity(1024);
        g.bench_function("encode", |b| {
            b.iter(|| {
                buf.clear();
                codec.encode_into(black_box(msg), &mut buf).unwrap();
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
