//! The pool user's handle resolution (RFC 5352 §3.3) with a cache of resolved PEs, and the
//! ENDPOINT_UNREACHABLE report (RFC 5352 §3.5).
//!
//! What a resolution returns is a *selection* by the registrar: the PEs it chose and the policy
//! values behind the choice. It says nothing about whether a PE can be reached.

use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, CodecConfig, HandleResolutionOption, Message, OperationError, PoolElement,
    PoolElementId, PoolHandle, PoolPolicy,
};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Settings of a resolver.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Items to ask for (Handle Resolution option); `None` leaves it to the registrar.
    pub items: Option<u32>,
    /// How long resolved PEs are served from the cache before asking again (the stale cache
    /// value; 0 = always ask).
    pub stale_cache: Duration,
    /// How long to wait for a HANDLE_RESOLUTION_RESPONSE.
    pub response_timeout: Duration,
    /// Most distinct pools kept in the cache.
    pub max_cached_pools: usize,
    /// Codec settings.
    pub codec: CodecConfig,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            items: None,
            stale_cache: Duration::ZERO,
            response_timeout: Duration::from_secs(3),
            max_cached_pools: 1024,
            codec: CodecConfig::default(),
        }
    }
}

/// A resolution asked of the resolver, to match its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// The PEs a registrar selected for a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The pool's policy as the registrar gave it (with the first PE's values).
    pub policy: Option<PoolPolicy>,
    /// The selected PEs in the registrar's order, with their policy values.
    pub pool_elements: Vec<PoolElement>,
    /// When the registrar answered (same epoch as `now`).
    pub resolved_at: Duration,
    /// Whether this answer came from the cache.
    pub from_cache: bool,
}

/// Why a resolution failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The registrar knows no such pool.
    #[error("unknown pool handle")]
    UnknownPoolHandle,
    /// The registrar refused (e.g. a rate limit) or failed with the given cause.
    #[error("the registrar answered {0}")]
    Refused(CauseCode),
    /// No answer in time.
    #[error("no answer from the registrar in time")]
    Timeout,
    /// The association to the registrar went down first.
    #[error("the association to the registrar went down")]
    RegistrarLost,
    /// No registrar could be reached at all.
    #[error("no registrar could be reached")]
    NoRegistrar,
    /// The registrar could not process the request and said why with an ASAP_ERROR (e.g. a
    /// pool handle over its limit).
    #[error("the registrar reported an error: {0}")]
    Rejected(String),
}

/// What the resolver reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolverEvent {
    /// A resolution completed.
    Resolved {
        /// The request.
        request: RequestId,
        /// The answer.
        resolution: Resolution,
    },
    /// A resolution failed.
    Failed {
        /// The request.
        request: RequestId,
        /// The pool.
        pool_handle: PoolHandle,
        /// Why.
        error: ResolveError,
    },
    /// A message from the registrar could not be used.
    ProtocolError(String),
}

#[derive(Debug)]
struct Pending {
    pool_handle: PoolHandle,
    deadline: Duration,
    waiting: Vec<RequestId>,
    sent: bool,
}

/// The resolver core.
pub struct Resolver {
    config: ResolverConfig,
    codec: Codec,
    connected: bool,
    next_request: u64,
    pending: VecDeque<Pending>,
    cache: HashMap<PoolHandle, Resolution>,
    transmits: VecDeque<Vec<u8>>,
    events: VecDeque<ResolverEvent>,
}

impl Resolver {
    /// A resolver; requests are sent once [`Resolver::connected`] is called.
    pub fn new(config: ResolverConfig) -> Self {
        Resolver {
            codec: Codec::new(config.codec),
            config,
            connected: false,
            next_request: 1,
            pending: VecDeque::new(),
            cache: HashMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ResolverConfig {
        &self.config
    }

    /// The next message for the registrar (ASAP, PPID 11).
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmits.pop_front()
    }

    /// The next report.
    pub fn poll_event(&mut self) -> Option<ResolverEvent> {
        self.events.pop_front()
    }

    /// When [`Resolver::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.pending.iter().map(|p| p.deadline).min()
    }

    /// The cached answer for a pool, if it is still fresh at `now`.
    pub fn cached(&self, now: Duration, pool_handle: &PoolHandle) -> Option<&Resolution> {
        self.cache
            .get(pool_handle)
            .filter(|r| now < r.resolved_at + self.config.stale_cache)
    }

    /// Resolves a pool handle: from the cache if fresh, else by asking the registrar. Requests
    /// for a pool already being resolved share the answer.
    pub fn resolve(&mut self, now: Duration, pool_handle: PoolHandle) -> RequestId {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        if let Some(r) = self.cached(now, &pool_handle) {
            let mut resolution = r.clone();
            resolution.from_cache = true;
            self.events.push_back(ResolverEvent::Resolved {
                request,
                resolution,
            });
            return request;
        }
        if let Some(p) = self
            .pending
            .iter_mut()
            .find(|p| p.pool_handle == pool_handle)
        {
            p.waiting.push(request);
            return request;
        }
        let mut p = Pending {
            pool_handle,
            deadline: now + self.config.response_timeout,
            waiting: vec![request],
            sent: false,
        };
        if self.connected {
            self.send_request(&mut p);
        }
        self.pending.push_back(p);
        request
    }

    /// Reports a PE the PU could not reach (RFC 5352 §3.5) and drops it from the cache.
    pub fn report_unreachable(&mut self, pool_handle: &PoolHandle, pe_id: PoolElementId) {
        if let Some(r) = self.cache.get_mut(pool_handle) {
            r.pool_elements.retain(|pe| pe.id != pe_id);
        }
        if self.connected {
            self.send(&AsapMessage::EndpointUnreachable(
                asap::EndpointUnreachable {
                    pool_handle: pool_handle.clone(),
                    pe_id,
                },
            ));
        }
    }

    /// The association to a registrar is up: send what waits.
    pub fn connected(&mut self, now: Duration) {
        self.connected = true;
        let mut pending = std::mem::take(&mut self.pending);
        for p in pending.iter_mut().filter(|p| !p.sent) {
            p.deadline = now + self.config.response_timeout;
            self.send_request(p);
        }
        self.pending = pending;
    }

    /// The association to the registrar is gone: what was asked of it fails.
    pub fn disconnected(&mut self, _now: Duration) {
        self.connected = false;
        for p in std::mem::take(&mut self.pending) {
            if p.sent {
                self.fail(p, ResolveError::RegistrarLost);
            } else {
                self.pending.push_back(p);
            }
        }
    }

    /// Fails every request not yet answered (e.g. no registrar could be reached).
    pub fn fail_all(&mut self, error: ResolveError) {
        for p in std::mem::take(&mut self.pending) {
            self.fail(p, error.clone());
        }
    }

    /// Fails what is overdue.
    pub fn handle_timeout(&mut self, now: Duration) {
        for p in std::mem::take(&mut self.pending) {
            if p.deadline <= now {
                self.fail(p, ResolveError::Timeout);
            } else {
                self.pending.push_back(p);
            }
        }
    }

    /// A message from the registrar.
    pub fn message(&mut self, now: Duration, bytes: &[u8]) {
        let m = match self.codec.decode::<AsapMessage>(bytes) {
            Ok(d) => d.message,
            Err(e) => {
                self.events
                    .push_back(ResolverEvent::ProtocolError(e.to_string()));
                return;
            }
        };
        if let AsapMessage::Error(e) = &m {
            // RFC 5352 §2.2.14: the registrar could not process a message of ours. It answers
            // an association's requests in order, so the error is about the oldest one still
            // waiting for its answer.
            match self.pending.iter().position(|p| p.sent) {
                Some(i) => {
                    let p = self.pending.remove(i).expect("found above");
                    self.fail(p, ResolveError::Rejected(e.error.to_string()));
                }
                None => self.events.push_back(ResolverEvent::ProtocolError(format!(
                    "ASAP_ERROR from the registrar with no request waiting: {}",
                    e.error
                ))),
            }
            return;
        }
        let AsapMessage::HandleResolutionResponse(r) = m else {
            self.events.push_back(ResolverEvent::ProtocolError(format!(
                "unexpected {} from the registrar",
                m.name()
            )));
            return;
        };
        let Some(i) = self
            .pending
            .iter()
            .position(|p| p.sent && p.pool_handle == r.pool_handle)
        else {
            self.events.push_back(ResolverEvent::ProtocolError(format!(
                "unsolicited handle resolution response for pool {}",
                r.pool_handle
            )));
            return;
        };
        let p = self.pending.remove(i).expect("found above");
        match (
            r.error.as_ref().and_then(OperationError::code),
            r.pool_elements.is_empty(),
        ) {
            (None, false) => {
                let resolution = Resolution {
                    pool_handle: r.pool_handle,
                    policy: r.overall_policy,
                    pool_elements: r.pool_elements,
                    resolved_at: now,
                    from_cache: false,
                };
                if self.config.stale_cache > Duration::ZERO {
                    if self.cache.len() >= self.config.max_cached_pools
                        && !self.cache.contains_key(&resolution.pool_handle)
                    {
                        // Make room: drop the oldest entry.
                        if let Some(oldest) = self
                            .cache
                            .iter()
                            .min_by_key(|(_, r)| r.resolved_at)
                            .map(|(k, _)| k.clone())
                        {
                            self.cache.remove(&oldest);
                        }
                    }
                    self.cache
                        .insert(resolution.pool_handle.clone(), resolution.clone());
                }
                for request in p.waiting {
                    self.events.push_back(ResolverEvent::Resolved {
                        request,
                        resolution: resolution.clone(),
                    });
                }
            }
            (Some(CauseCode::UnknownPoolHandle), _) | (None, true) => {
                self.cache.remove(&p.pool_handle);
                self.fail(p, ResolveError::UnknownPoolHandle)
            }
            (Some(code), _) => self.fail(p, ResolveError::Refused(code)),
        }
    }

    fn fail(&mut self, p: Pending, error: ResolveError) {
        for request in p.waiting {
            self.events.push_back(ResolverEvent::Failed {
                request,
                pool_handle: p.pool_handle.clone(),
                error: error.clone(),
            });
        }
    }

    fn send_request(&mut self, p: &mut Pending) {
        p.sent = true;
        self.send(&AsapMessage::HandleResolution(asap::HandleResolution {
            subscribe: false,
            pool_handle: p.pool_handle.clone(),
            option: self
                .config
                .items
                .map(|items| HandleResolutionOption { items }),
        }));
    }

    fn send(&mut self, m: &AsapMessage) {
        match self.codec.encode(m) {
            Ok(b) => self.transmits.push_back(b),
            Err(e) => self.events.push_back(ResolverEvent::ProtocolError(format!(
                "cannot encode {}: {e}",
                m.name()
            ))),
        }
    }
}
