//! What the services cost per message: PingPong answers (plain and signed cookies), cookie
//! sealing and opening, CalcApp codec. `cargo bench -p rserpool-services --bench services`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use rserpool_services::calcapp::{CalcAppMessage, CalcAppType};
use rserpool_services::cookie::{CookieKey, CookieSeal, HmacSeal, PlainSeal, SealContext};
use rserpool_services::pingpong::{
    Ping, PingPongCookie, PingPongMessage, PingPongServer, PingPongServerConfig,
};
use rserpool_services::{Now, ServerService, SessionId, SessionInfo, PPID_PINGPONG};
use std::sync::Arc;
use std::time::Duration;

fn seals() -> Vec<(&'static str, Arc<dyn CookieSeal>)> {
    let key = CookieKey::new([5u8; 32]).unwrap();
    vec![
        ("plain", Arc::new(PlainSeal::default())),
        (
            "hmac",
            Arc::new(HmacSeal::new(key, Duration::from_secs(300))),
        ),
    ]
}

fn cookies(c: &mut Criterion) {
    let ctx = SealContext {
        service: "pingpong",
        identity: Some(b"10.0.0.7"),
        unix_now: Now::VIRTUAL_EPOCH,
    };
    let payload = PingPongCookie { reply_no: 42 }.encode();
    for (name, seal) in seals() {
        c.bench_function(&format!("cookie seal {name}"), |b| {
            b.iter(|| black_box(seal.seal(&ctx, black_box(&payload))))
        });
        let sealed = seal.seal(&ctx, &payload);
        c.bench_function(&format!("cookie open {name}"), |b| {
            b.iter(|| black_box(seal.open(&ctx, black_box(&sealed)).unwrap()))
        });
    }
}

fn pingpong(c: &mut Criterion) {
    let ping = PingPongMessage::Ping(Ping {
        flags: 0,
        message_no: 1,
        data: b"Nachricht: 1, Zeitstempel: 1767225600000000".to_vec(),
    })
    .encode()
    .unwrap();
    for (name, seal) in seals() {
        let mut pe = PingPongServer::with_seal(PingPongServerConfig::default(), seal);
        let now = Now::from_monotonic(Duration::ZERO);
        pe.open_session(
            now,
            SessionId(1),
            SessionInfo {
                identity: Some(b"10.0.0.7".to_vec()),
            },
        );
        c.bench_function(&format!("pingpong ping->pong+cookie {name}"), |b| {
            b.iter(|| {
                pe.handle_message(now, SessionId(1), PPID_PINGPONG, 0, black_box(&ping))
                    .unwrap();
                while let Some(o) = pe.poll_output() {
                    black_box(o);
                }
            })
        });
    }
}

fn calcapp(c: &mut Criterion) {
    let bytes = CalcAppMessage {
        job_size: 5_000_000,
        ..CalcAppMessage::new(CalcAppType::Request, 7)
    }
    .encode();
    c.bench_function("calcapp decode+encode", |b| {
        b.iter(|| black_box(CalcAppMessage::decode(black_box(&bytes)).unwrap().encode()))
    });
}

criterion_group!(benches, cookies, pingpong, calcapp);
criterion_main!(benches);
