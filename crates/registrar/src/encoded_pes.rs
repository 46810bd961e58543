//! Each PE's Pool Element parameter as handle resolution responses carry it, encoded when the
//! PE is first returned after a (re-)registration and reused for every answer until it changes.

use rserpool_handlespace::{EntryId, PoolElementRef};
use rserpool_wire::{Codec, EncodeError, EncodedPoolElement};
use rustc_hash::FxHashMap;

/// The encoded PEs, by handlespace entry, each with the entry's revision it was encoded at.
#[derive(Debug, Default)]
pub(crate) struct EncodedPes {
    /// Keyed by handlespace entries (index and generation), never by peers' input: a fast
    /// hash is safe, and a reused slot never matches an old key.
    by_entry: FxHashMap<EntryId, (u32, EncodedPoolElement)>,
}

impl EncodedPes {
    /// Makes sure the PE's current values are encoded (encoding them if it has changed since).
    /// If they cannot be encoded, nothing is kept for it: [`EncodedPes::get`] never returns
    /// values older than the entry's.
    pub fn refresh(&mut self, codec: &Codec, pe: PoolElementRef<'_>) -> Result<(), EncodeError> {
        let revision = pe.revision();
        match self.by_entry.get(&pe.entry_id()) {
            Some((r, _)) if *r == revision => Ok(()),
            _ => match codec.encode_pool_element_for_users(pe.element()) {
                Ok(encoded) => {
                    self.by_entry.insert(pe.entry_id(), (revision, encoded));
                    Ok(())
                }
                Err(e) => {
                    self.by_entry.remove(&pe.entry_id());
                    Err(e)
                }
            },
        }
    }

    /// The PE as last encoded by [`EncodedPes::refresh`].
    pub fn get(&self, entry: EntryId) -> Option<&EncodedPoolElement> {
        self.by_entry.get(&entry).map(|(_, e)| e)
    }

    /// Drops a removed PE's encoding.
    pub fn forget(&mut self, entry: EntryId) {
        self.by_entry.remove(&entry);
    }

    /// How many PEs are kept encoded.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_entry.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_handlespace::Handlespace;
    use rserpool_wire::{
        PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
        TransportAddress, TransportUse, UserTransport,
    };
    use std::time::Duration;

    fn pe(id: u32, load: u32) -> PoolElement {
        PoolElement {
            id: PoolElementId(id),
            home_registrar: RegistrarId(1),
            registration_life: RegistrationLife::Finite(Duration::from_secs(30)),
            user_transport: UserTransport::Address(TransportAddress::sctp(
                7,
                TransportUse::DataOnly,
                vec![[10, 0, 0, id as u8].into()],
            )),
            policy: PoolPolicy::LeastUsed { load },
            asap_transport: None,
        }
    }

    #[test]
    fn an_encoding_follows_re_registrations_and_removals() {
        let codec = Codec::default();
        let pool = PoolHandle::from("P");
        let mut hs = Handlespace::default();
        let mut cache = EncodedPes::default();
        let at = Duration::ZERO;
        let entry = hs.register(&pool, pe(1, 10), None, at).unwrap().entry();
        let expect = |element: &PoolElement| codec.encode_pool_element_for_users(element).unwrap();

        cache.refresh(&codec, hs.get(entry).unwrap()).unwrap();
        assert_eq!(cache.get(entry), Some(&expect(&pe(1, 10))));

        // New values are encoded anew; an unchanged PE is not.
        hs.register(&pool, pe(1, 99), None, at).unwrap();
        assert_eq!(
            cache.get(entry),
            Some(&expect(&pe(1, 10))),
            "stale until refreshed"
        );
        cache.refresh(&codec, hs.get(entry).unwrap()).unwrap();
        assert_eq!(cache.get(entry), Some(&expect(&pe(1, 99))));

        // Values that cannot be encoded (a life beyond what milliseconds hold) leave nothing
        // behind rather than the old bytes.
        let mut too_long = pe(1, 99);
        too_long.registration_life = RegistrationLife::Finite(Duration::from_secs(10_000_000));
        hs.register(&pool, too_long, None, at).unwrap();
        assert!(cache.refresh(&codec, hs.get(entry).unwrap()).is_err());
        assert_eq!(cache.get(entry), None);

        // A removed PE's slot reused by another PE never yields the old bytes.
        hs.remove(entry).unwrap();
        cache.forget(entry);
        assert_eq!(cache.len(), 0);
        let reused = hs.register(&pool, pe(2, 5), None, at).unwrap().entry();
        assert_ne!(reused, entry);
        assert_eq!(cache.get(reused), None);
        cache.refresh(&codec, hs.get(reused).unwrap()).unwrap();
        assert_eq!(cache.get(reused), Some(&expect(&pe(2, 5))));
    }
}
