//! Many small messages in few allocations: each message is copied into a shared chunk and
//! handed out as a [`Bytes`] view of it, so that a message costs a copy and a reference count
//! instead of an allocation and a free. A chunk is freed when the last message in it is dropped,
//! so a message kept for long keeps its whole chunk.

use bytes::{Bytes, BytesMut};

/// Chunk size that [`MessageArena::default`] uses.
pub const DEFAULT_CHUNK: usize = 16 * 1024;

/// Copies messages into shared chunks of at least `chunk` bytes.
#[derive(Debug)]
pub struct MessageArena {
    buf: BytesMut,
    chunk: usize,
}

impl Default for MessageArena {
    fn default() -> Self {
        MessageArena::new(DEFAULT_CHUNK)
    }
}

impl MessageArena {
    /// An arena whose chunks hold `chunk` bytes (a larger message gets a chunk of its own size).
    pub fn new(chunk: usize) -> Self {
        MessageArena {
            buf: BytesMut::new(),
            chunk: chunk.max(1),
        }
    }

    /// A copy of `data`, in the current chunk if it has room, else in a new one.
    pub fn copy(&mut self, data: &[u8]) -> Bytes {
        if self.buf.capacity() < data.len() {
            // Never grown in place: earlier messages still point into the current chunk.
            self.buf = BytesMut::with_capacity(self.chunk.max(data.len()));
        }
        self.buf.extend_from_slice(data);
        self.buf.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_copied_whole_and_independent() {
        let mut arena = MessageArena::new(64);
        let mut kept = Vec::new();
        for i in 0..100u8 {
            let m: Vec<u8> = (0..(i % 40)).map(|j| i ^ j).collect();
            kept.push((arena.copy(&m), m));
        }
        // A message larger than a chunk, and an empty one.
        let big = vec![7u8; 1000];
        kept.push((arena.copy(&big), big));
        kept.push((arena.copy(&[]), Vec::new()));
        for (bytes, expected) in &kept {
            assert_eq!(&bytes[..], &expected[..]);
        }
        // Dropping some leaves the others intact.
        kept.retain(|(b, _)| b.len() % 2 == 0);
        for (bytes, expected) in &kept {
            assert_eq!(&bytes[..], &expected[..]);
        }
    }
}
