//! Bad input: each kind of damage gives the typed error that names the message, the parameter and
//! the byte offset, and the Operation Error cause a registrar answers with.

use rserpool_wire::{
    asap, AsapMessage, CauseCode, Codec, CodecConfig, DecodeError, DecodeErrorKind, EncodeError,
    EnrpMessage, ParameterType, PoolHandle,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// RSPLIB's ASAP_REGISTRATION from the capture (frame 29).
const REGISTRATION: &str = "01000038 0009000c 4563686f 506f6f6c 000a0028 2b9538f0 00000000 00015f90
                            00040010 e7120001 00010008 0aff0001 00080008 00000001";

fn asap_err(b: &[u8]) -> DecodeError {
    Codec::default()
        .decode::<AsapMessage>(b)
        .expect_err("must not decode")
}

#[test]
fn the_reference_registration_decodes() {
    let m = Codec::default()
        .decode::<AsapMessage>(&hex(REGISTRATION))
        .unwrap()
        .message;
    let AsapMessage::Registration(r) = m else {
        panic!("not a registration")
    };
    assert_eq!(r.pool_handle, PoolHandle::from("EchoPool"));
    assert_eq!(r.pool_element.id.0, 0x2b9538f0);
}

#[test]
fn truncated_message_names_offset_and_sizes() {
    let b = hex(REGISTRATION);
    let e = asap_err(&b[..30]);
    assert_eq!(e.message_type, Some(1));
    assert_eq!(
        e.kind,
        DecodeErrorKind::Truncated {
            needed: 56,
            available: 30
        }
    );
    assert!(
        e.to_string()
            .starts_with("ASAP ASAP_REGISTRATION at byte 0: truncated"),
        "{e}"
    );
    assert_eq!(
        e.answer_cause(&b[..30]).unwrap().code,
        CauseCode::InvalidValues
    );
}

#[test]
fn header_shorter_than_four_bytes() {
    let e = asap_err(&[1, 0]);
    assert_eq!(e.message_type, None);
    assert!(matches!(
        e.kind,
        DecodeErrorKind::Truncated {
            needed: 4,
            available: 2
        }
    ));
}

#[test]
fn message_length_below_header_size() {
    let e = asap_err(&hex("01000003"));
    assert!(
        matches!(e.kind, DecodeErrorKind::BadLength { length: 3, .. }),
        "{e}"
    );
    assert_eq!(e.offset, 2);
}

#[test]
fn parameter_longer_than_its_message() {
    // Pool Element claims 0x30 bytes inside a 56-byte message.
    let mut b = hex(REGISTRATION);
    b[18] = 0x00;
    b[19] = 0x30;
    let e = asap_err(&b);
    assert_eq!(e.parameter, Some(ParameterType::POOL_ELEMENT));
    assert_eq!(e.offset, 16);
    assert!(matches!(e.kind, DecodeErrorKind::Truncated { .. }), "{e}");
}

#[test]
fn nested_parameter_error_names_the_innermost_parameter() {
    // IPv4 Address parameter inside the SCTP transport claims length 12 instead of 8.
    let mut b = hex(REGISTRATION);
    // Make room: the address grows by 4 bytes, and so do the SCTP transport (0x10 -> 0x14), the
    // Pool Element (0x28 -> 0x2c) and the message (0x38 -> 0x3c).
    b.splice(48..48, [0u8, 0, 0, 0]);
    b[3] = 0x3c;
    b[19] = 0x2c;
    b[35] = 0x14;
    b[43] = 0x0c;
    let e = asap_err(&b);
    assert_eq!(e.parameter, Some(ParameterType::IPV4_ADDRESS), "{e}");
    assert_eq!(e.offset, 42);
    assert!(
        matches!(e.kind, DecodeErrorKind::BadLength { length: 12, .. }),
        "{e}"
    );
    let cause = e.answer_cause(&b).unwrap();
    assert_eq!(cause.code, CauseCode::InvalidValues);
    assert_eq!(
        cause.info,
        b[40..52].to_vec(),
        "quotes the offending parameter"
    );
}

#[test]
fn parameter_length_below_four() {
    let mut b = hex(REGISTRATION);
    b[7] = 2; // Pool Handle length 2
    let e = asap_err(&b);
    assert_eq!(e.parameter, Some(ParameterType::POOL_HANDLE));
    assert!(matches!(
        e.kind,
        DecodeErrorKind::BadLength { length: 2, .. }
    ));
}

#[test]
fn non_zero_padding_is_rejected() {
    // Pool handle "Echo" + "X": length 9, 3 bytes of padding, one of them not zero.
    let codec = Codec::default();
    let m = AsapMessage::HandleResolution(asap::HandleResolution {
        subscribe: false,
        pool_handle: PoolHandle::from("EchoX"),
        option: None,
    });
    let mut b = codec.encode(&m).unwrap();
    assert_eq!(b.len(), 16);
    b[14] = 0xff;
    let e = codec.decode::<AsapMessage>(&b).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::BadPadding);
    assert_eq!(e.offset, 13);
}

#[test]
fn missing_final_padding_is_accepted() {
    // Same message, message length and buffer without the 3 padding bytes of the last parameter.
    let codec = Codec::default();
    let m = AsapMessage::HandleResolution(asap::HandleResolution {
        subscribe: false,
        pool_handle: PoolHandle::from("EchoX"),
        option: None,
    });
    let mut b = codec.encode(&m).unwrap();
    b.truncate(13);
    b[3] = 13;
    assert_eq!(codec.decode::<AsapMessage>(&b).unwrap().message, m);
    // And with the message-level padding present after the shorter length.
    b.extend_from_slice(&[0, 0, 0]);
    assert_eq!(codec.decode::<AsapMessage>(&b).unwrap().message, m);
}

#[test]
fn trailing_bytes_after_the_message() {
    let mut b = hex(REGISTRATION);
    b.extend_from_slice(&[0, 0, 0, 0]);
    let e = asap_err(&b);
    assert_eq!(e.kind, DecodeErrorKind::TrailingBytes { count: 4 });
    assert_eq!(e.offset, 56);
}

#[test]
fn unknown_message_types_follow_their_action_bits() {
    // 0x0f: action 00, discard silently.
    let e = asap_err(&hex("0f000004"));
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnrecognizedMessage { report: false }
    );
    assert!(!e.should_report());
    assert!(e.answer_cause(&hex("0f000004")).is_none());
    // 0x4f: action 01, report with the message quoted.
    let b = hex("4f000008 01020304");
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnrecognizedMessage { report: true }
    );
    let cause = e.answer_cause(&b).unwrap();
    assert_eq!(cause.code, CauseCode::UnrecognizedMessage);
    assert_eq!(cause.info, b);
    // ENRP 0x00 is reserved.
    let e = Codec::default()
        .decode::<EnrpMessage>(&hex("00000004"))
        .unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnrecognizedMessage { report: false }
    );
}

/// An ASAP_HANDLE_RESOLUTION for "EchoPool" with an extra parameter of the given type appended.
fn resolution_with(ptype: u16) -> Vec<u8> {
    let mut b = hex("05000018 0009000c 4563686f 506f6f6c");
    b.extend_from_slice(&ptype.to_be_bytes());
    b.extend_from_slice(&hex("0008 cafebabe"));
    b
}

#[test]
fn unknown_parameter_action_00_stops_silently() {
    let b = resolution_with(0x0123);
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnrecognizedParameter { report: false }
    );
    assert_eq!(e.parameter, Some(ParameterType(0x0123)));
    assert_eq!(e.offset, 16);
    assert!(e.answer_cause(&b).is_none());
}

#[test]
fn unknown_parameter_action_01_stops_and_reports_the_parameter() {
    let b = resolution_with(0x4123);
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnrecognizedParameter { report: true }
    );
    let cause = e.answer_cause(&b).unwrap();
    assert_eq!(cause.code, CauseCode::UnrecognizedParameter);
    assert_eq!(cause.info, b[16..24].to_vec());
}

#[test]
fn unknown_parameter_action_10_is_skipped() {
    let d = Codec::default()
        .decode::<AsapMessage>(&resolution_with(0x8123))
        .unwrap();
    assert_eq!(d.unrecognized.len(), 1);
    assert!(!d.unrecognized[0].report);
    assert_eq!(d.to_report().count(), 0);
    assert!(matches!(d.message, AsapMessage::HandleResolution(_)));
}

#[test]
fn unknown_parameter_action_11_is_skipped_and_reported() {
    let d = Codec::default()
        .decode::<AsapMessage>(&resolution_with(0xc123))
        .unwrap();
    let u = d.to_report().next().expect("one to report");
    assert_eq!(u.parameter_type, ParameterType(0xc123));
    assert_eq!(u.offset, 16);
    assert_eq!(u.bytes, hex("c1230008 cafebabe"));
}

#[test]
fn known_parameter_in_the_wrong_message() {
    // A Cookie parameter in ASAP_HANDLE_RESOLUTION.
    let b = resolution_with(0x000d);
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnexpectedParameter(ParameterType::COOKIE)
    );
    assert_eq!(e.offset, 16);
}

#[test]
fn missing_required_parameter() {
    // ASAP_DEREGISTRATION with a pool handle but no PE identifier.
    let e = asap_err(&hex("02000010 0009000c 4563686f 506f6f6c"));
    assert_eq!(
        e.kind,
        DecodeErrorKind::MissingParameter(ParameterType::PE_IDENTIFIER)
    );
}

#[test]
fn duplicate_single_parameter() {
    let e = asap_err(&hex(
        "02000018 0009000c 4563686f 506f6f6c 000e0008 00000001 000e0008 00000002",
    ));
    // Length says 0x18 but there are 0x20 bytes: fix the length first.
    assert!(matches!(e.kind, DecodeErrorKind::TrailingBytes { .. }));
    let e = asap_err(&hex(
        "02000020 0009000c 4563686f 506f6f6c 000e0008 00000001 000e0008 00000002",
    ));
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnexpectedParameter(ParameterType::PE_IDENTIFIER)
    );
    assert_eq!(e.offset, 24);
}

#[test]
fn invalid_field_values() {
    // Policy type 0.
    let mut b = hex(REGISTRATION);
    b[52..56].copy_from_slice(&[0, 0, 0, 0]);
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::InvalidValue {
            field: "policy type",
            value: 0
        }
    );
    assert_eq!(
        e.parameter,
        Some(ParameterType::POOL_MEMBER_SELECTION_POLICY)
    );
    // Transport use 7.
    let mut b = hex(REGISTRATION);
    b[39] = 7;
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::InvalidValue {
            field: "transport use",
            value: 7
        }
    );
    assert_eq!(e.offset, 38);
    // Registration life -5.
    let mut b = hex(REGISTRATION);
    b[28..32].copy_from_slice(&(-5i32).to_be_bytes());
    let e = asap_err(&b);
    assert!(matches!(
        e.kind,
        DecodeErrorKind::InvalidValue {
            field: "registration life",
            ..
        }
    ));
    // Round Robin policy with a value field it does not have.
    let b = hex(
        "0100003c 0009000c 4563686f 506f6f6c 000a002c 2b9538f0 00000000 00015f90
                 00040010 e7120001 00010008 0aff0001 0008000c 00000001 00000005",
    );
    let e = asap_err(&b);
    assert!(
        matches!(e.kind, DecodeErrorKind::BadLength { length: 12, .. }),
        "{e}"
    );
}

#[test]
fn pool_handle_limits() {
    let e = asap_err(&hex("05000008 00090004"));
    assert!(
        matches!(e.kind, DecodeErrorKind::BadLength { .. }),
        "empty: {e}"
    );
    let long = AsapMessage::HandleResolution(asap::HandleResolution {
        subscribe: false,
        pool_handle: PoolHandle::new(vec![b'x'; 40]),
        option: None,
    });
    let b = Codec::default().encode(&long).unwrap();
    let e = asap_err(&b);
    assert_eq!(
        e.kind,
        DecodeErrorKind::TooLong {
            field: "pool handle",
            length: 40,
            limit: 32
        }
    );
    assert_eq!(e.answer_cause(&b).unwrap().code, CauseCode::LackOfResources);
    let roomy = Codec::new(CodecConfig {
        max_pool_handle_size: 64,
        ..CodecConfig::default()
    });
    assert_eq!(roomy.decode::<AsapMessage>(&b).unwrap().message, long);
}

#[test]
fn message_size_limit() {
    let small = Codec::new(CodecConfig {
        max_message_size: 40,
        ..CodecConfig::default()
    });
    let b = hex(REGISTRATION);
    let e = small.decode::<AsapMessage>(&b).unwrap_err();
    assert!(
        matches!(e.kind, DecodeErrorKind::MessageTooLarge { limit: 40, .. }),
        "{e}"
    );
    let m = Codec::default().decode::<AsapMessage>(&b).unwrap().message;
    assert_eq!(
        small.encode(&m),
        Err(EncodeError::MessageTooLarge {
            length: 56,
            limit: 40
        })
    );
}

#[test]
fn largest_cookie_fits_and_one_more_byte_does_not() {
    let codec = Codec::default();
    let cookie = |n: usize| {
        AsapMessage::Cookie(asap::Cookie {
            cookie: (0..n).map(|i| i as u8).collect(),
        })
    };
    // 4 (message header) + 4 (parameter header) + 65 524 = 65 532, the largest multiple of 4
    // that a 16-bit length can carry.
    let m = cookie(65_524);
    let b = codec.encode(&m).unwrap();
    assert_eq!(b.len(), 65_532);
    assert_eq!(codec.decode::<AsapMessage>(&b).unwrap().message, m);
    assert!(matches!(
        codec.encode(&cookie(65_525)),
        Err(EncodeError::MessageTooLarge { .. })
    ));
    let mut buf = vec![0xaa];
    assert!(codec.encode_into(&cookie(70_000), &mut buf).is_err());
    assert_eq!(
        buf,
        vec![0xaa],
        "a failed encode leaves the buffer as it was"
    );
}

#[test]
fn operation_error_with_bad_cause_length() {
    let b = hex("0e00000c 000c0008 00090003");
    let e = asap_err(&b);
    assert_eq!(e.parameter, Some(ParameterType::OPERATION_ERROR));
    assert!(
        matches!(e.kind, DecodeErrorKind::BadLength { length: 3, .. }),
        "{e}"
    );
    let b = hex("0e000008 000c0004");
    let e = asap_err(&b);
    assert!(
        matches!(e.kind, DecodeErrorKind::BadLength { .. }),
        "no cause: {e}"
    );
}

#[test]
fn handle_table_response_pool_element_before_pool_handle() {
    let codec = Codec::default();
    // ENRP_HANDLE_TABLE_RESPONSE whose first parameter is a Pool Element.
    let mut b = hex("03000000 00000001 00000002");
    b.extend_from_slice(&hex(
        "000a0028 2b9538f0 00000000 00015f90 00040010 e7120001 00010008 0aff0001 00080008 00000001",
    ));
    let len = b.len() as u16;
    b[2..4].copy_from_slice(&len.to_be_bytes());
    let e = codec.decode::<EnrpMessage>(&b).unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::MissingParameter(ParameterType::POOL_HANDLE)
    );
    assert_eq!(e.offset, 12);
}

#[test]
fn handle_update_with_unknown_action() {
    let e = Codec::default()
        .decode::<EnrpMessage>(&hex("04000010 00000001 00000002 00070000"))
        .unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::InvalidValue {
            field: "update action",
            value: 7
        }
    );
    assert_eq!(e.offset, 12);
    assert!(e.to_string().contains("ENRP_HANDLE_UPDATE"), "{e}");
}
