//! The registrar's tokio driver on loopback, for tests.

use crate::LOCALHOST;
use rserpool_endpoint::driver::RegistrarAccess;
use rserpool_registrar::driver::{run, DriverConfig, DriverError, Running};
use rserpool_registrar::{AddressScope, Metrics, Profile, RegistrarConfig};
use rserpool_transport::TransportChoice;
use rserpool_wire::RegistrarId;
use std::net::SocketAddr;
use std::ops::Deref;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A registrar driver running in the test's runtime: the TCP mapping and the HTTP endpoint on
/// 127.0.0.1 with ports the kernel chooses, announces off, addresses of loopback scope
/// accepted. Dereferences to the driver's [`Running`] (bound addresses, metrics). Dropping it
/// stops the driver; [`TestRegistrar::stop`] also waits for the end.
pub struct TestRegistrar {
    running: Running,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), DriverError>>>,
}

impl TestRegistrar {
    /// The identifier the registrar has unless the test changes it.
    pub const ID: RegistrarId = RegistrarId(0xabc);

    /// The configuration [`TestRegistrar::start`] begins with: RSPLIB profile, identifier
    /// [`TestRegistrar::ID`], seed 3, no announces, the TCP mapping on 127.0.0.1:0 and the HTTP
    /// endpoint on 127.0.0.1:0.
    pub fn config() -> DriverConfig {
        let mut core = RegistrarConfig::new(Profile::Rsplib);
        core.registrar_id = Self::ID;
        core.min_address_scope = AddressScope::Loopback;
        core.announce = None;
        core.seed = Some(3);
        let mut config = DriverConfig::new(core);
        config.transport = TransportChoice::Tcp;
        config.asap_listen = vec![SocketAddr::new(LOCALHOST, 0)];
        config.metrics_listen = Some(SocketAddr::new(LOCALHOST, 0));
        config
    }

    /// Starts a registrar with [`TestRegistrar::config`] changed by `tweak`; the driver's error
    /// when it cannot start (a bind that fails, bad TLS settings).
    pub async fn try_start(
        tweak: impl FnOnce(&mut DriverConfig),
    ) -> Result<TestRegistrar, DriverError> {
        let mut config = Self::config();
        tweak(&mut config);
        let (started_tx, started_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(run(config, started_tx, async {
            let _ = stop_rx.await;
        }));
        match started_rx.await {
            Ok(running) => Ok(TestRegistrar {
                running,
                stop: Some(stop_tx),
                task: Some(task),
            }),
            // The driver dropped the sender without starting: it ended, with its error.
            Err(_) => match task.await {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => panic!("the registrar driver ended before it started"),
                Err(e) => panic!("the registrar driver failed: {e}"),
            },
        }
    }

    /// [`TestRegistrar::try_start`]; a test that needs the registrar fails when it cannot start.
    pub async fn start(tweak: impl FnOnce(&mut DriverConfig)) -> TestRegistrar {
        match Self::try_start(tweak).await {
            Ok(r) => r,
            Err(e) => panic!("the registrar does not start: {e}"),
        }
    }

    /// The first ASAP address the registrar listens on.
    pub fn asap_addr(&self) -> SocketAddr {
        self.running.asap_addrs[0]
    }

    /// A copy of the counters as of the last step.
    pub fn metrics(&self) -> Metrics {
        self.running
            .metrics
            .lock()
            .map(|m| m.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// How PE and PU drivers reach this registrar: its first ASAP address over the TCP mapping.
    pub fn access(&self) -> RegistrarAccess {
        RegistrarAccess::single(self.asap_addr(), TransportChoice::Tcp)
    }

    /// Waits until `f` holds for the counters as of now ([`Running::metrics_now`], with the
    /// transport's), polling every 20 ms; panics naming `what` with the counters after `within`.
    pub async fn wait_metrics(&self, what: &str, within: Duration, f: impl Fn(&Metrics) -> bool) {
        let until = tokio::time::Instant::now() + within;
        loop {
            let m = self.running.metrics_now();
            if f(&m) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "timed out waiting for {what}: {m:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the driver and waits for it to end; its error if it failed.
    pub async fn stop(mut self) -> Result<(), DriverError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => match task.await {
                Ok(result) => result,
                Err(e) => panic!("the registrar driver failed: {e}"),
            },
            None => Ok(()),
        }
    }
}

impl Deref for TestRegistrar {
    type Target = Running;

    fn deref(&self) -> &Running {
        &self.running
    }
}

impl Drop for TestRegistrar {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
