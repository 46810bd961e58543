//! Where members come from. A static list from the configuration today; an RSerPool pool
//! (handle resolution through a registrar, refreshed, each PE with its user transport, policy
//! values and the registrar's liveness view) plugs in through the same trait.

use crate::core::member::MemberSpec;
use std::future::Future;
use std::pin::Pin;
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

/// The error type of a member source.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// A future a member source runs as.
pub type SourceFuture = Pin<Box<dyn Future<Output = Result<(), SourceError>> + Send>>;

/// A provider of pool members. The driver runs it as a task; it sends updates for as long as
/// it lives. Returning Ok ends updates (the last membership stays); an error is logged and the
/// gateway keeps its last membership.
pub trait MemberSource: Send + 'static {
    /// A short description for logs and status, e.g. "static (3 members)".
    fn describe(&self) -> String;
    /// Runs the source, sending updates on `updates`.
    fn run(self: Box<Self>, updates: mpsc::Sender<SourceUpdate>) -> SourceFuture;
}

/// The members listed in the configuration.
#[derive(Clone, Debug)]
pub struct StaticSource {
    members: Vec<MemberSpec>,
}

impl StaticSource {
    /// A source that delivers `members` once.
    pub fn new(members: Vec<MemberSpec>) -> Self {
        StaticSource { members }
    }
}

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
pub struct ChannelSource {
    rx: mpsc::Receiver<SourceUpdate>,
}

impl ChannelSource {
    /// A source and the sender that feeds it.
    pub fn new() -> (mpsc::Sender<SourceUpdate>, ChannelSource) {
        let (tx, rx) = mpsc::channel(64);
        (tx, ChannelSource { rx })
    }
}

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
pub struct RserpoolSource {
    config: crate::config::RserpoolConfig,
}

impl RserpoolSource {
    /// A source for the pool and registrars of `config`.
    pub fn new(config: crate::config::RserpoolConfig) -> Self {
        RserpoolSource { config }
    }
}

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
            let mut known: Vec<String> = Vec::new();
            let mut refused_logged: std::collections::HashSet<String> = Default::default();
            // What the last resolution said, so that a state is logged when it begins, not at
            // every refresh.
            let mut last_problem: Option<String> = None;
            let mut tick = tokio::time::interval(c.refresh);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let members = match client.resolve(c.pool_handle.clone()).await {
                    Ok(r) => {
                        if last_problem.take().is_some() {
                            tracing::info!(pool = %c.pool_handle, pes = r.pool_elements.len(), "pool resolved");
                        }
                        let mut members = Vec::new();
                        for pe in &r.pool_elements {
                            match MemberSpec::from_pool_element(pe, c.protocol) {
                                Ok(m) => members.push(m),
                                Err(why) => {
                                    if refused_logged.insert(why.clone()) {
                                        tracing::warn!(pool = %c.pool_handle, %why, "PE left out");
                                    }
                                }
                            }
                        }
                        members
                    }
                    // No PE left: the registrar forgets a pool with its last PE.
                    Err(ResolveError::UnknownPoolHandle) => {
                        let problem = "unknown pool".to_string();
                        if last_problem.as_ref() != Some(&problem) {
                            tracing::warn!(
                                pool = %c.pool_handle,
                                registrars = ?c.registrars,
                                "the registrar does not know this pool (no PE registered under this handle): no members until one registers"
                            );
                            last_problem = Some(problem);
                        }
                        Vec::new()
                    }
                    Err(e) => {
                        let problem = e.to_string();
                        if last_problem.as_ref() != Some(&problem) {
                            tracing::warn!(pool = %c.pool_handle, error = %e, "handle resolution failed; keeping the last membership");
                            last_problem = Some(problem);
                        }
                        continue;
                    }
                };
                // A PE the registrar no longer lists leaves the membership: no new bindings.
                // Whether it died or deregistered, the registrar does not say; sessions bound
                // to it end by their own evidence (reset, refused, idle), not by decree.
                let keys: Vec<String> = members.iter().map(|m| m.key.clone()).collect();
                if updates.send(SourceUpdate::Members(members)).await.is_err() {
                    return Ok(());
                }
                for key in keys.iter().filter(|k| !known.contains(k)) {
                    let evidence = SourceUpdate::Evidence {
                        key: key.clone(),
                        registered: true,
                    };
                    if updates.send(evidence).await.is_err() {
                        return Ok(());
                    }
                }
                known = keys;
            }
        })
    }
}
