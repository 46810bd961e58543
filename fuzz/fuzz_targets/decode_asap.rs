//! Any bytes into the ASAP decoder: never a panic; whatever decodes re-encodes to a message that
//! decodes to the same value, and canonical inputs re-encode byte for byte; what the in-place
//! reading of a handle resolution accepts, the decoder decodes to the same values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rserpool_wire::{AsapMessage, Codec, CodecConfig, LifeUnit};

fuzz_target!(|data: &[u8]| {
    for config in [
        CodecConfig::default(),
        CodecConfig {
            registration_life_unit: LifeUnit::Seconds,
            ..CodecConfig::default()
        },
    ] {
        let codec = Codec::new(config);
        // What the in-place reading of a handle resolution accepts, the decoder reads alike.
        if let Some(peeked) = codec.peek_handle_resolution(data) {
            let d = codec
                .decode::<AsapMessage>(data)
                .expect("a peeked handle resolution decodes");
            assert!(d.unrecognized.is_empty());
            match &d.message {
                AsapMessage::HandleResolution(h) => assert_eq!(h.as_ref(), peeked),
                other => panic!("peeked {other:?}"),
            }
        }
        if let Ok(d) = codec.decode::<AsapMessage>(data) {
            let bytes = codec.encode(&d.message).expect("a decoded message encodes");
            let again = codec
                .decode::<AsapMessage>(&bytes)
                .expect("its encoding decodes");
            assert_eq!(again.message, d.message);
            assert_eq!(codec.encode(&again.message).unwrap(), bytes);
        }
    }
});
