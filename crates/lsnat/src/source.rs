//! Where members come from: a static list from the configuration, or an RSerPool pool (handle
//! resolution through a registrar, refreshed, each PE with its user transport, policy values
//! and the registrar's liveness view), behind one trait.
//!
//! [`PoolMembership`], which turns handle resolutions into membership updates, is sans-IO and
//! needs no runtime: the tokio `RserpoolSource` and the deterministic simulator both use it.

use crate::core::member::MemberSpec;
use crate::core::Protocol;
use rserpool_wire::{PoolElement, PoolHandle};
use std::collections::BTreeSet;
#[cfg(feature = "runtime")]
use std::future::Future;
#[cfg(feature = "runtime")]
use std::pin::Pin;
#[cfg(feature = "runtime")]
use tokio::sync::mpsc;

/// Something a member source reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceUpdate {
    /// The complete current membership; replaces the previous list. Members keep their
    /// liveness history across updates by key.
    Members(Vec<MemberSpec>),
    /// Liveness evidence the source has (for RSerPool: the registrar's view of a PE).
    Evidence {
        /// The member's key.
        key: String,
        /// True: registered (evidence of life); false: gone (judged dead at once).
        registered: bool,
    },
}

/// The members of an RSerPool pool as handle resolutions report them, sans-IO: the gateway
/// acts as a pool user, resolves the pool handle at every refresh, and hands each outcome to
/// this type, which returns the updates for the core ([`crate::core::Gateway::set_members`],
/// [`crate::core::Gateway::source_evidence`]):
///
/// - an answer: each PE whose user transport the gateway's protocol carries becomes a member
///   (keyed by PE identifier, with its policy values) and the list replaces the last one; a
///   PE listed for the first time since it was last missing comes with the registrar's
///   evidence that it is registered; a PE the registrar stops listing leaves the membership
///   (no new bindings; sessions bound to it end by their own evidence, not by decree);
/// - "unknown pool" (a registrar forgets a pool with its last PE): no members;
/// - any other failure (no answer, no registrar): nothing changes, the last membership stays.
#[derive(Debug, Clone)]
pub struct PoolMembership {
    pool_handle: PoolHandle,
    protocol: Protocol,
    /// The keys of the last answer.
    known: BTreeSet<String>,
    /// Reasons for leaving a PE out that were logged already (each is logged once).
    refused_logged: BTreeSet<String>,
    /// What the last resolution said when it did not answer, so that a state is logged when
    /// it begins, not at every refresh.
    last_problem: Option<String>,
}

impl PoolMembership {
    /// Membership of `pool_handle` for listeners of `protocol`.
    pub fn new(pool_handle: PoolHandle, protocol: Protocol) -> Self {
        PoolMembership {
            pool_handle,
            protocol,
            known: BTreeSet::new(),
            refused_logged: BTreeSet::new(),
            last_problem: None,
        }
    }

    /// The registrar answered with `pool_elements`: the complete membership, then evidence
    /// for each PE new in it.
    pub fn resolved(&mut self, pool_elements: &[PoolElement]) -> Vec<SourceUpdate> {
        if self.last_problem.take().is_some() {
            tracing::info!(pool = %self.pool_handle, pes = pool_elements.len(), "pool resolved");
        }
        let mut members = Vec::new();
        for pe in pool_elements {
            match MemberSpec::from_pool_element(pe, self.protocol) {
                Ok(m) => members.push(m),
                Err(why) => {
                    if self.refused_logged.insert(why.clone()) {
                        tracing::warn!(pool = %self.pool_handle, %why, "PE left out");
                    }
                }
            }
        }
        self.replace(members)
    }

    /// The registrar does not know the pool (no PE is registered under its handle): no
    /// members until one registers.
    pub fn unknown_pool(&mut self, registrars: &str) -> Vec<SourceUpdate> {
        let problem = "unknown pool".to_string();
        if self.last_problem.as_ref() != Some(&problem) {
            tracing::warn!(
                pool = %self.pool_handle,
                registrars,
                "the registrar does not know this pool (no PE registered under this handle): no members until one registers"
            );
            self.last_problem = Some(problem);
        }
        self.replace(Vec::new())
    }

    /// The resolution failed otherwise (`error` says how): the last membership stays.
    pub fn failed(&mut self, error: &str) -> Vec<SourceUpdate> {
        if self.last_problem.as_deref() != Some(error) {
            tracing::warn!(pool = %self.pool_handle, error, "handle resolution failed; keeping the last membership");
            self.last_problem = Some(error.to_string());
        }
        Vec::new()
    }

    fn replace(&mut self, members: Vec<MemberSpec>) -> Vec<SourceUpdate> {
        let keys: BTreeSet<String> = members.iter().map(|m| m.key.clone()).collect();
        let fresh: Vec<String> = members
            .iter()
            .map(|m| m.key.clone())
            .filter(|k| !self.known.contains(k))
            .collect();
        let mut updates = vec![SourceUpdate::Members(members)];
        updates.extend(fresh.into_iter().map(|key| SourceUpdate::Evidence {
            key,
            registered: true,
        }));
        self.known = keys;
        updates
    }
}

/// The error type of a member source.
#[cfg(feature = "runtime")]
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// A future a member source runs as.
#[cfg(feature = "runtime")]
pub type SourceFuture = Pin<Box<dyn Future<Output = Result<(), SourceError>> + Send>>;

/// A provider of pool members. The driver runs it as a task; it sends updates for as long as
/// it lives. Returning Ok ends updates (the last membership stays); an error is logged and the
/// gateway keeps its last membership.
#[cfg(feature = "runtime")]
pub trait MemberSource: Send + 'static {
    /// A short description for logs and status, e.g. "static (3 members)".
    fn describe(&self) -> String;
    /// Runs the source, sending updates on `updates`.
    fn run(self: Box<Self>, updates: mpsc::Sender<SourceUpdate>) -> SourceFuture;
}

/// The members listed in the configuration.
#[cfg(feature = "runtime")]
#[derive(Clone, Debug)]
pub struct StaticSource {
    members: Vec<MemberSpec>,
}

#[cfg(feature = "runtime")]
impl StaticSource {
    /// A source that delivers `members` once.
    pub fn new(members: Vec<MemberSpec>) -> Self {
        StaticSource { members }
    }
}

#[cfg(feature = "runtime")]
impl MemberSource for StaticSource {
    fn describe(&self) -> String {
        format!("static ({} members)", self.members.len())
    }

    fn run(self: Box<Self>, updates: mpsc::Sender<SourceUpdate>) -> SourceFuture {
        Box::pin(async move {
            let _ = updates.send(SourceUpdate::Members(self.members)).await;
            Ok(())
        })
    }
}

/// A source driven by hand through a channel: tests, and embedding programs that manage
/// membership themselves.
#[cfg(feature = "runtime")]
pub struct ChannelSource {
    rx: mpsc::Receiver<SourceUpdate>,
}

#[cfg(feature = "runtime")]
impl ChannelSource {
    /// A source and the sender that feeds it.
    pub fn new() -> (mpsc::Sender<SourceUpdate>, ChannelSource) {
        let (tx, rx) = mpsc::channel(64);
        (tx, ChannelSource { rx })
    }
}

#[cfg(feature = "runtime")]
impl MemberSource for ChannelSource {
    fn describe(&self) -> String {
        "channel".into()
    }

    fn run(mut self: Box<Self>, updates: mpsc::Sender<SourceUpdate>) -> SourceFuture {
        Box::pin(async move {
            while let Some(u) = self.rx.recv().await {
                if updates.send(u).await.is_err() {
                    break;
                }
            }
            Ok(())
        })
    }
}

/// The PEs of an RSerPool pool, as a registrar reports them: the gateway acts as a pool user,
/// resolves the pool handle for all its PEs at every refresh, and turns each PE whose user
/// transport the listeners carry into a member (keyed by PE identifier, with its policy
/// values). A newly listed PE comes with the registrar's evidence that it is registered; a PE
/// the registrar stops listing leaves the membership; a registrar that cannot be reached
/// changes nothing (the last membership stays).
#[cfg(feature = "runtime")]
pub struct RserpoolSource {
    config: crate::config::RserpoolConfig,
}

#[cfg(feature = "runtime")]
impl RserpoolSource {
    /// A source for the pool and registrars of `config`.
    pub fn new(config: crate::config::RserpoolConfig) -> Self {
        RserpoolSource { config }
    }
}

#[cfg(feature = "runtime")]
impl MemberSource for RserpoolSource {
    fn describe(&self) -> String {
        format!(
            "RSerPool pool {} at {:?}",
            self.config.pool_handle, self.config.registrars
        )
    }

    fn run(self: Box<Self>, updates: mpsc::Sender<SourceUpdate>) -> SourceFuture {
        use rserpool_endpoint::driver::{PoolUserClient, RegistrarAccess};
        use rserpool_endpoint::pu::{ResolveError, ResolverConfig};
        Box::pin(async move {
            let c = self.config;
            let mut access = RegistrarAccess::single(c.registrars[0], c.transport);
            access.registrars = c.registrars.iter().map(|a| vec![*a]).collect();
            let client = PoolUserClient::start(
                ResolverConfig {
                    items: Some(rserpool_wire::HandleResolutionOption::ALL),
                    ..ResolverConfig::default()
                },
                access,
            )
            .await?;
            let mut membership = PoolMembership::new(c.pool_handle.clone(), c.protocol);
            let registrars = format!("{:?}", c.registrars);
            let mut tick = tokio::time::interval(c.refresh);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let batch = match client.resolve(c.pool_handle.clone()).await {
                    Ok(r) => membership.resolved(&r.pool_elements),
                    // No PE left: the registrar forgets a pool with its last PE.
                    Err(ResolveError::UnknownPoolHandle) => membership.unknown_pool(&registrars),
                    Err(e) => membership.failed(&e.to_string()),
                };
                for u in batch {
                    if updates.send(u).await.is_err() {
                        return Ok(());
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_wire::{
        PoolElementId, PoolPolicy, RegistrarId, RegistrationLife, TransportAddress, UserTransport,
    };
    use std::time::Duration;

    fn pe(id: u32, transport: TransportAddress) -> PoolElement {
        PoolElement {
            id: PoolElementId(id),
            home_registrar: RegistrarId(1),
            registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
            user_transport: UserTransport::Address(transport),
            policy: PoolPolicy::WeightedRoundRobin { weight: 3 },
            asap_transport: None,
        }
    }

    fn tcp(id: u32) -> PoolElement {
        pe(
            id,
            TransportAddress::tcp(8080, format!("10.8.0.{id}").parse().unwrap()),
        )
    }

    fn keys(u: &SourceUpdate) -> Vec<String> {
        match u {
            SourceUpdate::Members(m) => m.iter().map(|m| m.key.clone()).collect(),
            SourceUpdate::Evidence { .. } => panic!("not a member list: {u:?}"),
        }
    }

    #[test]
    fn an_answer_replaces_the_membership_with_evidence_for_new_pes_only() {
        let mut m = PoolMembership::new(PoolHandle::from("web"), Protocol::Tcp);
        let u = m.resolved(&[tcp(1), tcp(2)]);
        assert_eq!(
            keys(&u[0]),
            [PoolElementId(1), PoolElementId(2)].map(|i| format!("pe:{i}"))
        );
        assert_eq!(u.len(), 3, "{u:?}");
        assert!(
            matches!(&u[1], SourceUpdate::Evidence { key, registered: true } if key == &format!("pe:{}", PoolElementId(1)))
        );
        let SourceUpdate::Members(list) = &u[0] else {
            unreachable!()
        };
        assert_eq!(list[0].weight, 3);
        assert_eq!(list[0].address, "10.8.0.1:8080".parse().unwrap());
        // PE 1 left, PE 3 came: one list, evidence for PE 3 alone.
        let u = m.resolved(&[tcp(2), tcp(3)]);
        assert_eq!(
            keys(&u[0]),
            [PoolElementId(2), PoolElementId(3)].map(|i| format!("pe:{i}"))
        );
        assert_eq!(
            u[1..],
            [SourceUpdate::Evidence {
                key: format!("pe:{}", PoolElementId(3)),
                registered: true
            }]
        );
        // PE 1 listed again after it was missing: evidence again.
        let u = m.resolved(&[tcp(1), tcp(2), tcp(3)]);
        assert_eq!(u.len(), 2, "{u:?}");
    }

    #[test]
    fn a_failure_keeps_the_membership_and_an_unknown_pool_empties_it() {
        let mut m = PoolMembership::new(PoolHandle::from("web"), Protocol::Tcp);
        m.resolved(&[tcp(1)]);
        assert!(m.failed("no answer from the registrar in time").is_empty());
        let u = m.unknown_pool("[10.0.0.1:3863]");
        assert_eq!(u, [SourceUpdate::Members(Vec::new())]);
        // Back: PE 1 is new again, with its evidence.
        assert_eq!(m.resolved(&[tcp(1)]).len(), 2);
    }

    #[test]
    fn pes_the_protocol_does_not_carry_are_left_out() {
        let mut m = PoolMembership::new(PoolHandle::from("web"), Protocol::Tcp);
        let udp = pe(2, TransportAddress::udp(53, "10.8.0.2".parse().unwrap()));
        let u = m.resolved(&[tcp(1), udp]);
        assert_eq!(keys(&u[0]), [format!("pe:{}", PoolElementId(1))]);
        assert_eq!(u.len(), 2);
    }
}
