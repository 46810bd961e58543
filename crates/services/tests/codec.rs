//! PingPong and CalcApp codecs: byte-exact round trips for every value, RSPLIB's layouts as
//! literal bytes, and typed errors naming the field for malformed input (never a panic).

use proptest::prelude::*;
use rserpool_services::calcapp::{CalcAppCookie, CalcAppMessage, CalcAppType};
use rserpool_services::pingpong::{Ping, PingPongCookie, PingPongMessage, Pong};
use rserpool_services::{DecodeError, DecodeErrorKind};

#[test]
fn rsplib_layouts_as_bytes() {
    // pingpongclient's first Ping: "Nachricht: 1, Zeitstempel: 1700000000000000".
    let data = b"Nachricht: 1, Zeitstempel: 1700000000000000";
    let mut ping = vec![0x01, 0x00, 0x00, (12 + data.len()) as u8];
    ping.extend_from_slice(&1u64.to_be_bytes());
    ping.extend_from_slice(data);
    let decoded = PingPongMessage::decode(&ping).unwrap();
    assert_eq!(
        decoded,
        PingPongMessage::Ping(Ping {
            flags: 0,
            message_no: 1,
            data: data.to_vec()
        })
    );
    assert_eq!(decoded.encode().unwrap(), ping);

    let pong = PingPongMessage::Pong(Pong {
        flags: 0,
        message_no: 2,
        reply_no: 9,
        data: b"ab".to_vec(),
    });
    assert_eq!(
        pong.encode().unwrap(),
        [2, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9, b'a', b'b']
    );

    assert_eq!(
        PingPongCookie { reply_no: 0x0102 }.encode(),
        *b"<PP-TD1>\x00\x00\x00\x00\x00\x00\x01\x02"
    );

    let request = CalcAppMessage {
        job_size: 5_000_000,
        ..CalcAppMessage::new(CalcAppType::Request, 3)
    };
    assert_eq!(
        request.encode(),
        [1, 0, 0, 24, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0x4c, 0x4b, 0x40, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        CalcAppCookie {
            job_id: 3,
            job_size: 5_000_000,
            completed: 1
        }
        .encode(),
        [0, 0, 0, 3, 0, 0, 0, 0, 0, 0x4c, 0x4b, 0x40, 0, 0, 0, 0, 0, 0, 0, 1]
    );
}

fn err(message: &'static str, field: &'static str, kind: DecodeErrorKind) -> DecodeError {
    DecodeError {
        message,
        field,
        kind,
    }
}

#[test]
fn malformed_pingpong_names_the_field() {
    use DecodeErrorKind::*;
    let cases: Vec<(Vec<u8>, DecodeError)> = vec![
        (
            vec![],
            err(
                "PingPong message",
                "header",
                Truncated {
                    needed: 4,
                    available: 0,
                },
            ),
        ),
        (
            vec![1, 0, 0],
            err(
                "PingPong message",
                "header",
                Truncated {
                    needed: 4,
                    available: 3,
                },
            ),
        ),
        (
            vec![3, 0, 0, 4],
            err("PingPong message", "Type", UnknownType(3)),
        ),
        (
            vec![1, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0],
            err(
                "Ping",
                "Length",
                LengthMismatch {
                    declared: 12,
                    actual: 11,
                },
            ),
        ),
        (
            vec![1, 0, 0, 4],
            err(
                "Ping",
                "MessageNo",
                Truncated {
                    needed: 12,
                    available: 4,
                },
            ),
        ),
        (
            [vec![2, 0, 0, 16], vec![0; 12]].concat(),
            err(
                "Pong",
                "ReplyNo",
                Truncated {
                    needed: 20,
                    available: 16,
                },
            ),
        ),
        (
            [vec![1, 0, 0, 13], vec![0; 12]].concat(),
            err(
                "Ping",
                "Length",
                LengthMismatch {
                    declared: 13,
                    actual: 16,
                },
            ),
        ),
    ];
    for (bytes, expected) in cases {
        assert_eq!(
            PingPongMessage::decode(&bytes),
            Err(expected.clone()),
            "{bytes:?}"
        );
    }
    assert_eq!(
        PingPongCookie::decode(b"<PP-TD9>01234567")
            .unwrap_err()
            .field,
        "ID"
    );
    assert_eq!(
        PingPongCookie::decode(b"<PP-TD1>0123456")
            .unwrap_err()
            .field,
        "size"
    );
    let too_long = PingPongMessage::Ping(Ping {
        flags: 0,
        message_no: 1,
        data: vec![0; 65_524],
    });
    assert!(too_long.encode().is_err());
    let fits = PingPongMessage::Ping(Ping {
        flags: 0,
        message_no: 1,
        data: vec![0; 65_523],
    });
    assert_eq!(fits.encode().unwrap().len(), 65_535);
}

#[test]
fn malformed_calcapp_names_the_field() {
    let ok = CalcAppMessage::new(CalcAppType::Complete, 1).encode();
    let e = CalcAppMessage::decode(&ok[..6]).unwrap_err();
    assert_eq!((e.message, e.field), ("CalcAppComplete", "JobID"));
    let e = CalcAppMessage::decode(&ok[..20]).unwrap_err();
    assert_eq!(e.field, "Completed");
    let e = CalcAppMessage::decode(&[ok.to_vec(), vec![0]].concat()).unwrap_err();
    assert_eq!(e.field, "Length");
    let mut bad = ok;
    bad[3] = 25;
    assert_eq!(CalcAppMessage::decode(&bad).unwrap_err().field, "Length");
    bad[0] = 0;
    assert_eq!(
        CalcAppMessage::decode(&bad).unwrap_err().kind,
        DecodeErrorKind::UnknownType(0)
    );
    assert_eq!(
        CalcAppCookie::decode(&[0; 10]).unwrap_err().field,
        "JobSize"
    );
    assert_eq!(CalcAppCookie::decode(&[0; 21]).unwrap_err().field, "size");
}

fn calcapp_type() -> impl Strategy<Value = CalcAppType> {
    (1u8..=7).prop_map(|v| CalcAppType::from_u8(v).unwrap())
}

proptest! {
    #[test]
    fn pingpong_roundtrip(is_ping: bool, flags: u8, message_no: u64, reply_no: u64,
                          data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let m = if is_ping {
            PingPongMessage::Ping(Ping { flags, message_no, data })
        } else {
            PingPongMessage::Pong(Pong { flags, message_no, reply_no, data })
        };
        let bytes = m.encode().unwrap();
        prop_assert_eq!(PingPongMessage::decode(&bytes).unwrap(), m);
    }

    #[test]
    fn calcapp_roundtrip(kind in calcapp_type(), flags: u8, job_id: u32, job_size: u64, completed: u64) {
        let m = CalcAppMessage { kind, flags, job_id, job_size, completed };
        let bytes = m.encode();
        prop_assert_eq!(CalcAppMessage::decode(&bytes).unwrap(), m);
    }

    #[test]
    fn cookies_roundtrip(reply_no: u64, job_id: u32, job_size: u64, completed: u64) {
        let p = PingPongCookie { reply_no };
        prop_assert_eq!(PingPongCookie::decode(&p.encode()).unwrap(), p);
        let c = CalcAppCookie { job_id, job_size, completed };
        prop_assert_eq!(CalcAppCookie::decode(&c.encode()).unwrap(), c);
    }

    /// Whatever the bytes, decoding returns (never panics), and what decodes re-encodes to the
    /// same bytes.
    #[test]
    fn arbitrary_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(m) = PingPongMessage::decode(&bytes) {
            prop_assert_eq!(m.encode().unwrap(), bytes.clone());
        }
        if let Ok(m) = CalcAppMessage::decode(&bytes) {
            prop_assert_eq!(m.encode().to_vec(), bytes.clone());
        }
        if let Ok(c) = PingPongCookie::decode(&bytes) {
            prop_assert_eq!(c.encode().to_vec(), bytes.clone());
        }
        if let Ok(c) = CalcAppCookie::decode(&bytes) {
            prop_assert_eq!(c.encode().to_vec(), bytes.clone());
        }
    }

    /// Flipping any bit of a valid message either still decodes (to different values that
    /// re-encode exactly) or gives an error: no panic, no silent acceptance of a bad length.
    #[test]
    fn damaged_messages(message_no: u64, data in proptest::collection::vec(any::<u8>(), 0..40),
                        bit in 0usize..(8 * 52), truncate in 0usize..60) {
        let bytes = PingPongMessage::Ping(Ping { flags: 0, message_no, data }).encode().unwrap();
        let mut damaged = bytes.clone();
        if bit / 8 < damaged.len() {
            damaged[bit / 8] ^= 1 << (bit % 8);
        }
        damaged.truncate(truncate.min(damaged.len()));
        if let Ok(m) = PingPongMessage::decode(&damaged) {
            prop_assert_eq!(m.encode().unwrap(), damaged);
        }
    }
}
