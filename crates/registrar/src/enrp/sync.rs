//! Handle table synchronisation (RFC 5353 §3.2.1, §3.4, §3.6.3): the start-up download from the
//! mentor (W=0), the audit's resynchronisation of one peer's PEs (W=1, mark and sweep), and
//! serving our table in chunks with a cursor per requesting peer.

use super::peers::{Cursor, Download};
use super::*;
use rserpool_handlespace::PoolElementRef;
use rserpool_wire::enrp::HandleTableEntry;
use rserpool_wire::Parameter;

/// Header, Sender and Receiver IDs of a HANDLE_TABLE_RESPONSE.
const RESPONSE_HEADER: usize = 12;

impl Enrp {
    /// Starts downloading a peer's table: all of it from the mentor, or only its own PEs for
    /// an audit, after marking the PEs we hold for it.
    pub(super) fn start_download(
        &mut self,
        now: Duration,
        registrar: &Registrar,
        peer: RegistrarId,
        own_children_only: bool,
        mentor: bool,
        reason: &'static str,
    ) {
        let marked = if own_children_only {
            registrar
                .handlespace()
                .owned_by(peer)
                .map(|pe| (pe.pool_handle().clone(), pe.id()))
                .collect()
        } else {
            Default::default()
        };
        let Some(p) = self.peers.get_mut(peer) else {
            return;
        };
        p.download = Some(Download {
            own_children_only,
            mentor,
            marked,
            received: 0,
            requested_at: now,
        });
        self.metrics.syncs_started += 1;
        self.events.push_back(EnrpEvent::SyncStarted {
            peer,
            own_children_only,
            reason,
        });
        self.request_table(peer, own_children_only);
    }

    fn request_table(&mut self, peer: RegistrarId, own_children_only: bool) {
        let m = EnrpMessage::HandleTableRequest(enrp::HandleTableRequest {
            peers: self.ids(peer),
            own_children_only,
        });
        self.send_to_peer(peer, &m);
    }

    /// Serves the next chunk of our table to a peer (RFC 5353 §3.4): at most N PEs and the
    /// byte cap per response, M=1 while more follow; the next request continues after the
    /// peer's cursor. A peer not in the table is refused with R=1, as RSPLIB does.
    pub(super) fn handle_table_request(
        &mut self,
        registrar: &Registrar,
        source: Source,
        r: enrp::HandleTableRequest,
    ) {
        let sender = r.peers.sender;
        let Some(destination) = self.reply_destination(source, sender) else {
            return;
        };
        let Some(peer) = self.peers.get_mut(sender) else {
            self.metrics.ignored += 1;
            let m = EnrpMessage::HandleTableResponse(enrp::HandleTableResponse {
                peers: self.ids(sender),
                reject: true,
                more_to_send: false,
                entries: Vec::new(),
            });
            self.events.push_back(EnrpEvent::Ignored {
                source,
                message: "ENRP_HANDLE_TABLE_REQUEST",
                reason: "sender is not a known peer (answered with R=1)",
            });
            return self.send(destination, &m);
        };
        let cursor = peer
            .cursor
            .take()
            .filter(|c| c.own_children_only == r.own_children_only);
        let (entries, last, more) = self.chunk(registrar, r.own_children_only, cursor.as_ref());
        if let Some(peer) = self.peers.get_mut(sender) {
            peer.cursor = match (more, last) {
                (true, Some(after)) => Some(Cursor {
                    own_children_only: r.own_children_only,
                    after,
                }),
                _ => None,
            };
        }
        let m = EnrpMessage::HandleTableResponse(enrp::HandleTableResponse {
            peers: self.ids(sender),
            reject: false,
            more_to_send: more,
            entries,
        });
        self.send(destination, &m);
    }

    /// One response's worth of PEs after the cursor, in pool handle and PE ID order; our own
    /// only with W=1.
    #[allow(clippy::type_complexity)]
    fn chunk(
        &self,
        registrar: &Registrar,
        own_children_only: bool,
        cursor: Option<&Cursor>,
    ) -> (
        Vec<HandleTableEntry>,
        Option<(PoolHandle, PoolElementId)>,
        bool,
    ) {
        let hs = registrar.handlespace();
        let max_n = self.config.max_elements_per_handle_table_response.max(1);
        let max_bytes = self.config.max_handle_table_response_bytes;
        let me = self.id;
        let wanted = move |pe: &PoolElementRef<'_>| !own_children_only || pe.home_registrar() == me;
        let walk: Box<dyn Iterator<Item = PoolElementRef<'_>> + '_> = match cursor {
            Some(c) => Box::new(
                hs.pool(&c.after.0)
                    .into_iter()
                    .flat_map(move |p| p.elements_after(c.after.1))
                    .chain(hs.pools_after(&c.after.0).flat_map(|p| p.elements())),
            ),
            None => Box::new(hs.pools().flat_map(|p| p.elements())),
        };
        let mut entries: Vec<HandleTableEntry> = Vec::new();
        let mut size = RESPONSE_HEADER;
        let mut last = None;
        let mut more = false;
        for (count, pe) in walk.filter(wanted).enumerate() {
            if count >= max_n {
                more = true;
                break;
            }
            let element = pe.element().clone();
            let pe_size = self
                .codec
                .encode_parameters(&[Parameter::PoolElement(element.clone())])
                .map_or(usize::MAX / 4, |b| b.len());
            let same_pool = entries
                .last()
                .is_some_and(|e| &e.pool_handle == pe.pool_handle());
            let handle_size = if same_pool {
                0
            } else {
                (4 + pe.pool_handle().len()).div_ceil(4) * 4
            };
            if count > 0 && size + pe_size + handle_size > max_bytes {
                more = true;
                break;
            }
            size += pe_size + handle_size;
            last = Some((pe.pool_handle().clone(), pe.id()));
            if same_pool {
                if let Some(e) = entries.last_mut() {
                    e.pool_elements.push(element);
                }
            } else {
                entries.push(HandleTableEntry {
                    pool_handle: pe.pool_handle().clone(),
                    pool_elements: vec![element],
                });
            }
        }
        (entries, last, more)
    }

    /// A chunk of a peer's table: PEs taken in under their home registrar; with M=1 the next
    /// request goes out at once; with M=0 the PEs still marked are dropped (RFC 5353 §3.6.3).
    pub(super) fn handle_table_response(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        source: Source,
        r: enrp::HandleTableResponse,
    ) {
        let sender = r.peers.sender;
        let Some(mut download) = self.peers.get_mut(sender).and_then(|p| p.download.take()) else {
            return self.ignore(
                source,
                "ENRP_HANDLE_TABLE_RESPONSE",
                "no handle table request to that peer outstanding",
            );
        };
        if r.reject {
            if download.mentor {
                self.mentor = None;
            }
            self.events.push_back(EnrpEvent::SyncDone {
                peer: sender,
                received: download.received,
                dropped: 0,
                rejected: true,
            });
            return;
        }
        for entry in r.entries {
            for mut pe in entry.pool_elements {
                if pe.home_registrar.0 == 0 {
                    pe.home_registrar = sender;
                }
                download.marked.remove(&(entry.pool_handle.clone(), pe.id));
                download.received += 1;
                if pe.home_registrar == self.id {
                    // Our own PEs, as the mentor knew them: ours are authoritative.
                    continue;
                }
                self.learn(now, registrar, sender, &entry.pool_handle, pe);
            }
        }
        download.requested_at = now;
        if r.more_to_send {
            let w = download.own_children_only;
            if let Some(p) = self.peers.get_mut(sender) {
                p.download = Some(download);
            }
            self.request_table(sender, w);
            return;
        }
        let mut dropped = 0;
        for (pool_handle, pe_id) in download.marked.drain() {
            if let Ok(true) = registrar.forget(&pool_handle, pe_id) {
                dropped += 1;
            }
        }
        self.metrics.pool_elements_dropped += dropped as u64;
        self.events.push_back(EnrpEvent::SyncDone {
            peer: sender,
            received: download.received,
            dropped,
            rejected: false,
        });
        if download.mentor {
            self.end_startup(Some(sender));
        }
    }

    /// Takes in one PE a peer sent (table or update), within the per-peer limit.
    pub(super) fn learn(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        from: RegistrarId,
        pool_handle: &PoolHandle,
        pe: rserpool_wire::PoolElement,
    ) -> bool {
        let home = pe.home_registrar;
        let pe_id = pe.id;
        let known = registrar.handlespace().find(pool_handle, pe_id).is_some();
        if !known
            && registrar.handlespace().owned_count(home) >= self.config.max_pool_elements_per_peer
        {
            self.metrics.limits_hit += 1;
            self.metrics.updates_refused += 1;
            self.events.push_back(EnrpEvent::LimitReached {
                what: "PEs per peer (max_pool_elements_per_peer)",
                peer: home,
            });
            return false;
        }
        match registrar.learn(now, pool_handle, pe) {
            Ok(new) => {
                if new {
                    self.metrics.pool_elements_learned += 1;
                }
                true
            }
            Err(e) => {
                self.metrics.updates_refused += 1;
                self.events.push_back(EnrpEvent::UpdateRefused {
                    peer: from,
                    pool_handle: pool_handle.clone(),
                    pe_id,
                    reason: e.to_string(),
                });
                false
            }
        }
    }
}
