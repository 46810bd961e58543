//! The frame format of the TCP mapping (`docs/tcp-mapping.md`), without I/O.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  Marker 0xE1  |     Type      |            Stream             |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |              Payload Protocol Identifier (PPID)               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                        Payload Length                         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                     Payload (Length bytes)                    |
//! ```
//!
//! All fields are in network byte order. Types: 0 DATA, 1 KEEPALIVE, 2 KEEPALIVE_ACK.

use bytes::{Buf, Bytes, BytesMut};

/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 12;
/// First byte of every frame: identifies the mapping and its version (1). Its top two bits are
/// `11`, a reserved action-bit pattern for ASAP and ENRP message types (RFC 5354 §4), so a
/// mapped stream can never be mistaken for plain ASAP.
pub const MARKER: u8 = 0xE1;
/// The largest payload length any configuration may allow (16 MiB); the configured limit
/// ([`Limits::max_message_size`](crate::Limits)) is usually far smaller.
pub const MAX_FRAME_PAYLOAD: usize = 16 * 1024 * 1024;
/// Largest payload of a KEEPALIVE or KEEPALIVE_ACK frame.
pub const MAX_KEEPALIVE_PAYLOAD: usize = 64;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameType {
    /// One whole user message with its PPID and stream.
    Data,
    /// A liveness probe; the receiver answers with KEEPALIVE_ACK echoing the payload.
    KeepAlive,
    /// The answer to a KEEPALIVE.
    KeepAliveAck,
}

impl FrameType {
    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        match self {
            FrameType::Data => 0,
            FrameType::KeepAlive => 1,
            FrameType::KeepAliveAck => 2,
        }
    }

    /// The type with this wire value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(FrameType::Data),
            1 => Some(FrameType::KeepAlive),
            2 => Some(FrameType::KeepAliveAck),
            _ => None,
        }
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its type.
    pub frame_type: FrameType,
    /// Stream number (DATA); 0 otherwise.
    pub stream: u16,
    /// Payload protocol identifier (DATA); 0 otherwise.
    pub ppid: u32,
    /// The payload.
    pub payload: Bytes,
}

/// Why a byte stream is not a valid sequence of frames (mapped) or ASAP messages (plain).
/// The association that delivered it is closed; no other is affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first byte of a frame header is not [`MARKER`].
    #[error("bad frame marker 0x{found:02x} (expected 0x{:02x})", MARKER)]
    BadMarker {
        /// The byte found.
        found: u8,
    },
    /// Unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The length exceeds the receiver's limit.
    #[error("message of {length} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Length announced by the header.
        length: usize,
        /// The receiver's limit.
        limit: usize,
    },
    /// A KEEPALIVE(_ACK) longer than [`MAX_KEEPALIVE_PAYLOAD`].
    #[error("keep-alive frame of {0} bytes")]
    KeepAliveTooLarge(usize),
    /// Plain ASAP: a message length below the 4-byte header.
    #[error("ASAP message length {0} is shorter than its header")]
    ShortAsapLength(usize),
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed inside a frame ({0} bytes pending)")]
    Truncated(usize),
}

/// Writes a frame header.
pub fn encode_header(
    frame_type: FrameType,
    stream: u16,
    ppid: u32,
    len: usize,
) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_FRAME_PAYLOAD);
    let mut h = [0u8; HEADER_LEN];
    h[0] = MARKER;
    h[1] = frame_type.to_u8();
    h[2..4].copy_from_slice(&stream.to_be_bytes());
    h[4..8].copy_from_slice(&ppid.to_be_bytes());
    h[8..12].copy_from_slice(&(len as u32).to_be_bytes());
    h
}

/// Appends a whole frame (header and payload) to `out`.
pub fn encode(out: &mut BytesMut, frame_type: FrameType, stream: u16, ppid: u32, payload: &[u8]) {
    out.extend_from_slice(&encode_header(frame_type, stream, ppid, payload.len()));
    out.extend_from_slice(payload);
}

/// Splits a byte stream into frames. Checks every header before buffering its payload, so a
/// peer can make it hold at most `max_payload` + [`HEADER_LEN`] bytes.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_payload: usize,
}

impl FrameDecoder {
    /// A decoder accepting payloads up to `max_payload` bytes.
    pub fn new(max_payload: usize) -> Self {
        FrameDecoder {
            max_payload: max_payload.min(MAX_FRAME_PAYLOAD),
        }
    }

    /// Takes the next whole frame off the front of `buf`, `Ok(None)` if more bytes are needed.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(h) = buf.get(..HEADER_LEN) else {
            if let Some(&m) = buf.first() {
                if m != MARKER {
                    return Err(FrameError::BadMarker { found: m });
                }
            }
            return Ok(None);
        };
        if h[0] != MARKER {
            return Err(FrameError::BadMarker { found: h[0] });
        }
        let frame_type = FrameType::from_u8(h[1]).ok_or(FrameError::UnknownType(h[1]))?;
        let stream = u16::from_be_bytes([h[2], h[3]]);
        let ppid = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        match frame_type {
            FrameType::Data if len > self.max_payload => {
                return Err(FrameError::TooLarge {
                    length: len,
                    limit: self.max_payload,
                })
            }
            FrameType::KeepAlive | FrameType::KeepAliveAck if len > MAX_KEEPALIVE_PAYLOAD => {
                return Err(FrameError::KeepAliveTooLarge(len))
            }
            _ => {}
        }
        if buf.len() < HEADER_LEN + len {
            buf.reserve(HEADER_LEN + len - buf.len());
            return Ok(None);
        }
        buf.advance(HEADER_LEN);
        let payload = buf.split_to(len).freeze();
        Ok(Some(Frame {
            frame_type,
            stream,
            ppid,
            payload,
        }))
    }

    /// At end of stream: an error if a partial frame is left.
    pub fn finish(&self, buf: &BytesMut) -> Result<(), FrameError> {
        if buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated(buf.len()))
        }
    }
}

/// Splits a plain-TCP byte stream into ASAP messages by the length in their common header
/// (RFC 5352 §3.3), padded to 4 bytes.
#[derive(Debug, Clone)]
pub struct AsapLengthDecoder {
    max_message: usize,
}

impl AsapLengthDecoder {
    /// A decoder accepting messages up to `max_message` bytes.
    pub fn new(max_message: usize) -> Self {
        AsapLengthDecoder { max_message }
    }

    /// Takes the next whole message off the front of `buf`, `Ok(None)` if more bytes are needed.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        let Some(len) = rserpool_wire::Codec::frame_length(buf) else {
            return Ok(None);
        };
        let declared = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
        if declared < 4 {
            return Err(FrameError::ShortAsapLength(declared));
        }
        if len > self.max_message {
            return Err(FrameError::TooLarge {
                length: len,
                limit: self.max_message,
            });
        }
        if buf.len() < len {
            buf.reserve(len - buf.len());
            return Ok(None);
        }
        Ok(Some(buf.split_to(len).freeze()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(bytes: &[u8], max: usize, chunk: usize) -> Result<Vec<Frame>, FrameError> {
        let d = FrameDecoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for c in bytes.chunks(chunk.max(1)) {
            buf.extend_from_slice(c);
            while let Some(f) = d.decode(&mut buf)? {
                out.push(f);
            }
        }
        d.finish(&buf)?;
        Ok(out)
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let h = encode_header(FrameType::Data, 0x0102, 11, 0x0a0b0c);
        assert_eq!(h, [0xE1, 0, 1, 2, 0, 0, 0, 11, 0, 0x0a, 0x0b, 0x0c]);
        let h = encode_header(FrameType::KeepAliveAck, 0, 0, 8);
        assert_eq!(h[1], 2);
    }

    #[test]
    fn round_trip_in_any_chunking() {
        let mut out = BytesMut::new();
        encode(&mut out, FrameType::Data, 3, 11, b"control");
        encode(&mut out, FrameType::KeepAlive, 0, 0, &[1, 2, 3, 4]);
        encode(&mut out, FrameType::Data, 0, 0xFAEE_B5D1, &[]);
        let big = vec![0x5a; 65_536];
        encode(&mut out, FrameType::Data, 65_535, 33, &big);
        for chunk in [1, 5, 12, 13, 1000, usize::MAX] {
            let f = frames(&out, 65_536, chunk.min(out.len())).unwrap();
            assert_eq!(f.len(), 4);
            assert_eq!(
                (f[0].frame_type, f[0].stream, f[0].ppid),
                (FrameType::Data, 3, 11)
            );
            assert_eq!(&f[0].payload[..], b"control");
            assert_eq!(f[1].frame_type, FrameType::KeepAlive);
            assert_eq!(&f[1].payload[..], &[1, 2, 3, 4]);
            assert_eq!((f[2].ppid, f[2].payload.len()), (0xFAEE_B5D1, 0));
            assert_eq!((f[3].stream, f[3].ppid), (65_535, 33));
            assert_eq!(f[3].payload, big);
        }
    }

    #[test]
    fn oversized_frame_is_refused_before_buffering() {
        let h = encode_header(FrameType::Data, 0, 11, 65_537);
        let d = FrameDecoder::new(65_536);
        let mut buf = BytesMut::from(&h[..]);
        assert_eq!(
            d.decode(&mut buf),
            Err(FrameError::TooLarge {
                length: 65_537,
                limit: 65_536
            })
        );
        // A length beyond any limit (4 GiB - 1) is refused the same way.
        let mut buf = BytesMut::from(&[0xE1, 0, 0, 0, 0, 0, 0, 11, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            d.decode(&mut buf),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn garbage_is_a_typed_error() {
        let d = FrameDecoder::new(1024);
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf),
            Err(FrameError::BadMarker { found: b'G' })
        );
        // Detected from the first byte, before a whole header arrived.
        let mut buf = BytesMut::from(&[0x05u8][..]);
        assert_eq!(d.decode(&mut buf), Err(FrameError::BadMarker { found: 5 }));
        let mut buf = BytesMut::from(&[0xE1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(d.decode(&mut buf), Err(FrameError::UnknownType(9)));
        let mut buf = BytesMut::from(&encode_header(FrameType::KeepAlive, 0, 0, 65)[..]);
        assert_eq!(d.decode(&mut buf), Err(FrameError::KeepAliveTooLarge(65)));
        assert_eq!(
            frames(&encode_header(FrameType::Data, 0, 11, 10), 1024, 100),
            Err(FrameError::Truncated(12))
        );
    }

    #[test]
    fn decoder_never_panics_on_arbitrary_bytes() {
        // A deterministic pseudo-random walk over inputs, with valid headers mixed in.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let d = FrameDecoder::new(256);
        let a = AsapLengthDecoder::new(256);
        for round in 0..2000 {
            let mut bytes = Vec::new();
            if round % 3 == 0 {
                bytes.extend_from_slice(&encode_header(
                    FrameType::Data,
                    1,
                    11,
                    (round % 300) as usize,
                ));
            }
            for _ in 0..(round % 64) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bytes.push(x as u8);
            }
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = d.decode(&mut buf) {}
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = a.decode(&mut buf) {}
        }
    }

    #[test]
    fn plain_asap_is_framed_by_the_message_length() {
        // ASAP_HANDLE_RESOLUTION for pool "EchoPool": header (type 5, length 16) + Pool Handle.
        let msg: &[u8] = &[
            0x05, 0x00, 0x00, 0x10, 0x00, 0x09, 0x00, 0x0c, b'E', b'c', b'h', b'o', b'P', b'o',
            b'o', b'l',
        ];
        let a = AsapLengthDecoder::new(65_536);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&msg[..7]);
        assert_eq!(a.decode(&mut buf), Ok(None));
        buf.extend_from_slice(&msg[7..]);
        buf.extend_from_slice(msg);
        assert_eq!(a.decode(&mut buf).unwrap().unwrap(), msg);
        assert_eq!(a.decode(&mut buf).unwrap().unwrap(), msg);
        assert!(buf.is_empty());
        let mut buf = BytesMut::from(&[5u8, 0, 0, 2][..]);
        assert_eq!(a.decode(&mut buf), Err(FrameError::ShortAsapLength(2)));
        let a = AsapLengthDecoder::new(8);
        let mut buf = BytesMut::from(msg);
        assert!(matches!(
            a.decode(&mut buf),
            Err(FrameError::TooLarge {
                length: 16,
                limit: 8
            })
        ));
    }
}
