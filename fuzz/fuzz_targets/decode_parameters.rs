//! Any bytes into the parameter decoder (every RFC 5354 parameter on its own): never a panic;
//! whatever decodes re-encodes to parameters that decode to the same values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rserpool_wire::{Codec, Protocol};

fuzz_target!(|data: &[u8]| {
    let codec = Codec::default();
    if let Ok(d) = codec.decode_parameters(Protocol::Asap, data) {
        let bytes = codec
            .encode_parameters(&d.message)
            .expect("decoded parameters encode");
        let again = codec
            .decode_parameters(Protocol::Asap, &bytes)
            .expect("and decode");
        assert_eq!(again.message, d.message);
    }
});
