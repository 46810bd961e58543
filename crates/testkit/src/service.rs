//! A tiny TCP service that tells which member of a pool answered.

use crate::LOCALHOST;
use std::io;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A TCP service on 127.0.0.1 (port chosen by the kernel) that answers every connection, once
/// it has read something, with its name and closes it. Stops when dropped.
pub struct NamedService {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl NamedService {
    /// Starts the service `name`.
    pub async fn start(name: &'static str) -> io::Result<NamedService> {
        let l = TcpListener::bind(SocketAddr::new(LOCALHOST, 0)).await?;
        let addr = l.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let mut b = [0u8; 16];
                    if s.read(&mut b).await.is_ok() {
                        let _ = s.write_all(name.as_bytes()).await;
                    }
                });
            }
        });
        Ok(NamedService { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for NamedService {
    fn drop(&mut self) {
        self.task.abort();
    }
}
