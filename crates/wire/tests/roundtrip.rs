//! Property tests: every typed message survives encode → decode unchanged, every encoding survives
//! decode → encode byte for byte, and no input, however damaged, makes the decoder panic.

use proptest::prelude::*;
use rserpool_wire::arbitrary::{
    asap_message, enrp_message, parameter, policy, pool_element, pool_handle,
};
use rserpool_wire::{AsapMessage, Codec, CodecConfig, EnrpMessage, LifeUnit, Message, Protocol};

fn roundtrip<M: Message>(codec: &Codec, m: &M) -> Result<(), TestCaseError> {
    let bytes = codec.encode(m).expect("valid messages encode");
    prop_assert_eq!(bytes.len() % 4, 0, "messages are padded to 4 bytes");
    let decoded = codec.decode::<M>(&bytes).expect("own encodings decode");
    prop_assert!(decoded.unrecognized.is_empty());
    prop_assert_eq!(&decoded.message, m);
    prop_assert_eq!(codec.encode(&decoded.message).unwrap(), bytes);
    Ok(())
}

/// A copy of `bytes` damaged by each edit in turn: a byte set, a bit flipped, a truncation or
/// an inserted byte.
fn damaged(bytes: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for &(pos, kind, value) in edits {
        if b.is_empty() {
            break;
        }
        let i = pos % b.len();
        match kind % 4 {
            0 => b[i] = value,
            1 => b[i] ^= 1 << (value % 8),
            2 => b.truncate(i),
            _ => b.insert(i, value),
        }
    }
    b
}

/// Damages a valid encoding in one of several ways; whatever comes out must not panic the
/// decoder, and if it still decodes, its re-encoding must decode to the same message.
fn mutated<M: Message>(codec: &Codec, bytes: &[u8], edits: &[(usize, u8, u8)]) {
    let b = damaged(bytes, edits);
    if let Ok(d) = codec.decode::<M>(&b) {
        let again = codec.encode(&d.message).expect("a decoded message encodes");
        let d2 = codec.decode::<M>(&again).expect("and decodes again");
        assert_eq!(d2.message, d.message);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn asap_roundtrip_ms(m in asap_message(LifeUnit::Milliseconds)) {
        roundtrip(&Codec::default(), &m)?;
    }

    /// A handle resolution response built from PEs encoded beforehand is the owned one's, byte
    /// for byte, with every PE's ASAP transport left out.
    #[test]
    fn preencoded_handle_resolution_response_matches(
        handle in pool_handle(),
        overall in proptest::option::of(policy()),
        pes in proptest::collection::vec(pool_element(LifeUnit::Milliseconds), 0..6),
    ) {
        let codec = Codec::default();
        let encoded: Vec<_> = pes
            .iter()
            .map(|pe| codec.encode_pool_element_for_users(pe).unwrap())
            .collect();
        let mut borrowed = vec![0xee];
        codec
            .encode_handle_resolution_response(handle.as_bytes(), overall.as_ref(), &encoded, &mut borrowed)
            .unwrap();
        let owned = AsapMessage::HandleResolutionResponse(rserpool_wire::asap::HandleResolutionResponse {
            accepted: false,
            pool_handle: handle,
            overall_policy: overall,
            pool_elements: pes
                .into_iter()
                .map(|pe| rserpool_wire::PoolElement { asap_transport: None, ..pe })
                .collect(),
            error: None,
        });
        prop_assert_eq!(&borrowed[1..], &codec.encode(&owned).unwrap()[..]);
        prop_assert_eq!(borrowed[0], 0xee, "appends");
    }

    #[test]
    fn enrp_roundtrip_ms(m in enrp_message(LifeUnit::Milliseconds)) {
        roundtrip(&Codec::default(), &m)?;
    }

    #[test]
    fn asap_roundtrip_seconds(m in asap_message(LifeUnit::Seconds)) {
        roundtrip(&Codec::new(CodecConfig::rfc()), &m)?;
    }

    #[test]
    fn enrp_roundtrip_seconds(m in enrp_message(LifeUnit::Seconds)) {
        roundtrip(&Codec::new(CodecConfig::rfc()), &m)?;
    }

    #[test]
    fn damaged_asap_never_panics(
        m in asap_message(LifeUnit::Milliseconds),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
    ) {
        let codec = Codec::default();
        mutated::<AsapMessage>(&codec, &codec.encode(&m).unwrap(), &edits);
    }

    #[test]
    fn damaged_enrp_never_panics(
        m in enrp_message(LifeUnit::Milliseconds),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
    ) {
        let codec = Codec::default();
        mutated::<EnrpMessage>(&codec, &codec.encode(&m).unwrap(), &edits);
    }

    #[test]
    fn parameters_roundtrip(ps in proptest::collection::vec(parameter(LifeUnit::Milliseconds), 0..6)) {
        let codec = Codec::default();
        let bytes = codec.encode_parameters(&ps).unwrap();
        let decoded = codec.decode_parameters(Protocol::Asap, &bytes).unwrap();
        prop_assert_eq!(&decoded.message, &ps);
        prop_assert_eq!(codec.encode_parameters(&decoded.message).unwrap(), bytes);
    }

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        let codec = Codec::default();
        let _ = codec.decode::<AsapMessage>(&b);
        let _ = codec.decode::<EnrpMessage>(&b);
        let _ = codec.decode_parameters(Protocol::Enrp, &b);
    }
}

/// What [`Codec::peek_handle_resolution`] accepts, the full decoder decodes to the same values
/// without unrecognized parameters.
fn peek_agrees(codec: &Codec, bytes: &[u8]) -> Result<bool, TestCaseError> {
    let Some(peeked) = codec.peek_handle_resolution(bytes) else {
        return Ok(false);
    };
    let decoded = codec.decode::<AsapMessage>(bytes);
    let Ok(decoded) = decoded else {
        return Err(TestCaseError::fail(format!(
            "peek accepted what decode refuses: {decoded:?}"
        )));
    };
    prop_assert!(decoded.unrecognized.is_empty());
    match &decoded.message {
        AsapMessage::HandleResolution(h) => prop_assert_eq!(h.as_ref(), peeked),
        other => prop_assert!(false, "peek accepted {:?}", other),
    }
    Ok(true)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Every handle resolution of the usual shape is peeked, unpadded or padded, as decoded.
    #[test]
    fn handle_resolutions_are_peeked_as_decoded(
        subscribe in any::<bool>(),
        handle in pool_handle(),
        items in proptest::option::of(any::<u32>()),
    ) {
        let codec = Codec::default();
        let m = AsapMessage::HandleResolution(rserpool_wire::asap::HandleResolution {
            subscribe,
            pool_handle: handle,
            option: items.map(|items| rserpool_wire::HandleResolutionOption { items }),
        });
        let bytes = codec.encode(&m).unwrap();
        prop_assert!(peek_agrees(&codec, &bytes)?, "not peeked: {:02x?}", bytes);
        // Without the message's padding, as a sender may leave it.
        let length = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
        prop_assert!(peek_agrees(&codec, &bytes[..length])?);
    }

    /// Damaged handle resolutions and any other message: the peek accepts nothing the decoder
    /// would read differently.
    #[test]
    fn the_peek_never_disagrees_with_the_decoder(
        m in asap_message(LifeUnit::Milliseconds),
        handle in pool_handle(),
        items in any::<u32>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..4),
        tight in any::<bool>(),
    ) {
        let codec = if tight {
            Codec::new(CodecConfig { max_pool_handle_size: 4, max_message_size: 16, ..CodecConfig::default() })
        } else {
            Codec::default()
        };
        let resolution = AsapMessage::HandleResolution(rserpool_wire::asap::HandleResolution {
            subscribe: false,
            pool_handle: handle,
            option: Some(rserpool_wire::HandleResolutionOption { items }),
        });
        for message in [m, resolution] {
            let Ok(b) = Codec::default().encode(&message) else { continue };
            peek_agrees(&codec, &damaged(&b, &edits))?;
        }
    }
}
