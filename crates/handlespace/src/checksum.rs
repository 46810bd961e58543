//! The PE checksum of RFC 5353 §3.6.2: the RFC 1071 Internet checksum, per owning registrar,
//! over the concatenation for each owned PE of its pool handle zero-padded to a multiple of 4
//! bytes and its 4-byte PE identifier in network byte order.
//!
//! The one's-complement sum does not depend on the order of the PEs and zero padding adds
//! nothing, so each PE contributes a fixed word sum that can be added and subtracted as PEs come
//! and go. The word sums are kept with the bytes of each 16-bit word read low byte first (the
//! way RSPLIB reads them on little-endian hosts); a one's-complement sum computed in swapped
//! byte order is the byte-swapped sum (RFC 1071 §2(B)), so one accumulator yields both the RFC
//! value and RSPLIB's 32-bit-wrapping variant ([`ChecksumFlavor`]).

use crate::ChecksumFlavor;
use rserpool_wire::{PeChecksum, PoolElementId, PoolHandle};

/// The word sum one PE contributes to its owner's checksum (words read low byte first).
pub(crate) fn element_words(handle: &[u8], id: PoolElementId) -> u64 {
    let mut sum = 0u64;
    let mut chunks = handle.chunks_exact(2);
    for c in &mut chunks {
        sum += u64::from(u16::from_le_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(*last);
    }
    let id = id.0.to_be_bytes();
    sum + u64::from(u16::from_le_bytes([id[0], id[1]]))
        + u64::from(u16::from_le_bytes([id[2], id[3]]))
}

/// Finishes an accumulated word sum into the checksum as carried on the wire.
pub(crate) fn finish(sum: u64, flavor: ChecksumFlavor) -> PeChecksum {
    let mut s = match flavor {
        ChecksumFlavor::Rsplib => sum & 0xffff_ffff,
        ChecksumFlavor::Rfc1071 => sum,
    };
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    // The sum was taken with swapped bytes; swap back to network order.
    PeChecksum((!(s as u16)).swap_bytes())
}

/// Computes a PE checksum from scratch over the given (pool handle, PE identifier) pairs, for
/// example the PEs a peer announced in a handle table. The handlespace keeps the same value
/// incrementally per owner ([`Handlespace::checksum`](crate::Handlespace::checksum)).
pub fn compute_checksum<'a>(
    elements: impl IntoIterator<Item = (&'a PoolHandle, PoolElementId)>,
    flavor: ChecksumFlavor,
) -> PeChecksum {
    let sum = elements
        .into_iter()
        .map(|(h, id)| element_words(h.as_bytes(), id))
        .sum();
    finish(sum, flavor)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straight RFC 1071 over the RFC 5353 §3.6.2 byte string, big-endian words, for comparison.
    fn reference(elements: &[(&[u8], u32)]) -> u16 {
        let mut bytes = Vec::new();
        for (h, id) in elements {
            bytes.extend_from_slice(h);
            while bytes.len() % 4 != 0 {
                bytes.push(0);
            }
            bytes.extend_from_slice(&id.to_be_bytes());
        }
        let mut sum: u64 = bytes
            .chunks(2)
            .map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn empty_owner_is_ffff() {
        assert_eq!(
            compute_checksum([], ChecksumFlavor::Rsplib),
            PeChecksum(0xffff)
        );
    }

    #[test]
    fn rsplib_capture_vectors() {
        // rsplib-takeover.pcap: registrar $4b6b12b3 owning DeadPool/$3138b21e and
        // EchoPool/$a2a2df63 announces 0xc74e; after DeadPool's PE is gone, 0x104b.
        let dead = PoolHandle::from("DeadPool");
        let echo = PoolHandle::from("EchoPool");
        for flavor in [ChecksumFlavor::Rsplib, ChecksumFlavor::Rfc1071] {
            let both = [
                (&dead, PoolElementId(0x3138_b21e)),
                (&echo, PoolElementId(0xa2a2_df63)),
            ];
            assert_eq!(compute_checksum(both, flavor), PeChecksum(0xc74e));
            let one = [(&echo, PoolElementId(0xa2a2_df63))];
            assert_eq!(compute_checksum(one, flavor), PeChecksum(0x104b));
        }
    }

    #[test]
    fn matches_reference_with_odd_handles() {
        let cases: [(&[u8], u32); 4] = [
            (b"a", 1),
            (b"abc", 0xdead_beef),
            (b"\xff\xff\xff\xff\xff", 0xffff_ffff),
            (b"EchoPool", 0x0102_0304),
        ];
        for n in 0..=cases.len() {
            let set = &cases[..n];
            let handles: Vec<PoolHandle> = set.iter().map(|(h, _)| PoolHandle::from(*h)).collect();
            let got = compute_checksum(
                handles
                    .iter()
                    .zip(set.iter().map(|(_, id)| PoolElementId(*id))),
                ChecksumFlavor::Rfc1071,
            );
            assert_eq!(got.0, reference(set), "{n} PEs");
        }
    }

    #[test]
    fn flavors_differ_once_the_sum_passes_2_pow_32() {
        // 2 048 words of 0xffff per PE: 40 PEs sum to about 5.4e9 > 2^32.
        let handle = PoolHandle::new(vec![0xff; 4096]);
        let ids: Vec<_> = (1..=40).map(PoolElementId).collect();
        let rfc = compute_checksum(ids.iter().map(|id| (&handle, *id)), ChecksumFlavor::Rfc1071);
        let rsplib = compute_checksum(ids.iter().map(|id| (&handle, *id)), ChecksumFlavor::Rsplib);
        let raw: Vec<(&[u8], u32)> = ids.iter().map(|id| (handle.as_bytes(), id.0)).collect();
        assert_eq!(rfc.0, reference(&raw));
        assert_ne!(rfc, rsplib);
    }
}
