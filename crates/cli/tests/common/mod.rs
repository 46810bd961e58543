//! The harness the tests of real `rserpool` processes share: registrars over the TCP mapping on
//! 127.0.0.1 with ephemeral ports, their metrics, waiting for a condition with a deadline, and a
//! minimal PE made of raw wire messages that listens on its ASAP port as an SCTP PE would.

#![allow(dead_code)] // each test file uses a part

pub mod process;

use rserpool_testkit::http;
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, UserTransport,
};
use socket2::{Domain, Socket, Type};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Registrar {
    pub child: Child,
    pub enrp: SocketAddr,
    pub asap: SocketAddr,
    pub metrics: SocketAddr,
}

impl Drop for Registrar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn between<'a>(s: &'a str, from: &str, to: &str) -> &'a str {
    let i = s.find(from).map(|i| i + from.len()).unwrap_or(0);
    let j = s[i..].find(to).map(|j| i + j).unwrap_or(s.len());
    &s[i..j]
}

pub fn start(id: u32, peer: Option<SocketAddr>) -> Registrar {
    start_with(id, peer, &[])
}

pub fn start_with(id: u32, peer: Option<SocketAddr>, extra: &[&str]) -> Registrar {
    start_at("127.0.0.1", None, id, peer, extra)
}

/// Starts a registrar on `ip`, inside the network namespace `netns` when given.
pub fn start_at(
    ip: &str,
    netns: Option<&str>,
    id: u32,
    peer: Option<SocketAddr>,
    extra: &[&str],
) -> Registrar {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_rserpool")]);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_rserpool")),
    };
    let any = format!("{ip}:0");
    cmd.args([
        "registrar",
        "--transport",
        "tcp",
        "--asap",
        &any,
        "--enrp",
        &any,
        "--metrics",
        &any,
        "--asap-announce",
        "off",
        "--enrp-announce",
        "off",
        "--min-address-scope",
        "loopback",
        "--identifier",
        &id.to_string(),
    ]);
    if !extra.contains(&"--default-timers") {
        // ENRP timers shorter than RSPLIB's defaults, so that a takeover comes within seconds,
        // yet long enough that a loaded machine does not make a live peer look dead.
        cmd.args([
            "--mentor-discovery-timeout",
            "1s",
            "--peer-heartbeat-cycle",
            "1s",
            "--peer-max-time-last-heard",
            "4s",
            "--peer-max-time-no-response",
            "3s",
            "--takeover-expiry-interval",
            "10s",
        ]);
    }
    if let Some(p) = peer {
        cmd.args(["--peer", &p.to_string()]);
    }
    cmd.args(extra.iter().filter(|a| **a != "--default-timers"));
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(match std::env::var("ENRP_TEST_LOG_DIR") {
            Ok(d) => Stdio::from(std::fs::File::create(format!("{d}/{id:x}.log")).unwrap()),
            Err(_) => Stdio::null(),
        })
        .spawn()
        .expect("rserpool runs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut asap, mut metrics, mut enrp) = (None, None, None);
    let mut line = String::new();
    while enrp.is_none() {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("registrar {id} exited");
        }
        if line.contains("serving ASAP") {
            asap = Some(between(&line, "on ", " (").parse().unwrap());
            metrics = Some(between(&line, "http://", "/metrics").parse().unwrap());
        }
        if line.contains("serving ENRP") {
            enrp = Some(
                between(&line, "serving ENRP on ", "\n")
                    .trim()
                    .parse()
                    .unwrap(),
            );
        }
    }
    // Keep reading so the pipe never fills.
    std::thread::spawn(move || for _ in out.lines() {});
    Registrar {
        child,
        enrp: enrp.unwrap(),
        asap: asap.unwrap(),
        metrics: metrics.unwrap(),
    }
}

/// The registrar's `/metrics` text; empty when it does not answer (it may be restarting).
pub fn metrics(r: &Registrar) -> String {
    http::get_blocking(r.metrics, "/metrics")
        .map(|answer| answer.body)
        .unwrap_or_default()
}

pub fn metric(r: &Registrar, name: &str) -> u64 {
    metrics(r)
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn wait_for(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !f() {
        if Instant::now() >= end {
            if let Ok(s) = std::env::var("ENRP_TEST_METRICS") {
                for m in s.split(',') {
                    if let Ok(http::Response { body, .. }) = http::get_blocking(m, "/metrics") {
                        eprintln!(
                            "{m}: {}",
                            body.lines()
                                .filter(|l| !l.starts_with('#')
                                    && (l.contains("pool_elements")
                                        || l.contains("regist")
                                        || l.contains("enrp_peer")))
                                .collect::<Vec<_>>()
                                .join("\n")
                        );
                    }
                }
            }
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn frame(ppid: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0xe1, 0, 0, 0];
    f.extend_from_slice(&ppid.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads mapped frames; answers mapping keep-alives and ASAP keep-alives; reports H=1 ones.
pub fn serve_pe(
    mut s: TcpStream,
    codec: Codec,
    pe_id: u32,
    homes: Arc<Mutex<Vec<(RegistrarId, Instant)>>>,
) {
    loop {
        let mut h = [0u8; 12];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let mut p = vec![0u8; len];
        if s.read_exact(&mut p).is_err() {
            return;
        }
        if h[1] == 1 {
            let _ = s.write_all(&[0xe1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            continue;
        }
        if let Ok(d) = codec.decode::<AsapMessage>(&p) {
            if let AsapMessage::EndpointKeepAlive(k) = d.message {
                if k.home {
                    homes.lock().unwrap().push((k.server_id, Instant::now()));
                }
                let ack = AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
                    pool_handle: k.pool_handle,
                    pe_id: k.pe_id.unwrap_or(PoolElementId(pe_id)),
                });
                let _ = s.write_all(&frame(11, &codec.encode(&ack).unwrap()));
            }
        }
    }
}

pub fn reuse_socket() -> Socket {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.set_reuse_port(true).unwrap();
    s
}

/// Registers one PE at `home` from a port it also listens on.
pub fn pe(home: &Registrar, pe_id: u32) -> Arc<Mutex<Vec<(RegistrarId, Instant)>>> {
    pes(home, &[pe_id])
}

/// Registers PEs in "EnrpPool" at `home` over one association, from a port it also listens on.
pub fn pes(home: &Registrar, ids: &[u32]) -> Arc<Mutex<Vec<(RegistrarId, Instant)>>> {
    pes_at("127.0.0.1", home, "EnrpPool", ids)
}

/// Like [`pes`], with the PEs on the address `ip`.
pub fn pes_from(
    ip: &str,
    home: &Registrar,
    ids: &[u32],
) -> Arc<Mutex<Vec<(RegistrarId, Instant)>>> {
    pes_at(ip, home, "EnrpPool", ids)
}

/// Like [`pes`], in `pool`.
pub fn pes_in(
    home: &Registrar,
    pool: &str,
    ids: &[u32],
) -> Arc<Mutex<Vec<(RegistrarId, Instant)>>> {
    pes_at("127.0.0.1", home, pool, ids)
}

/// Registers PEs in `pool` at `home` over one association, from a port on `ip` it also listens
/// on.
pub fn pes_at(
    ip: &str,
    home: &Registrar,
    pool: &str,
    ids: &[u32],
) -> Arc<Mutex<Vec<(RegistrarId, Instant)>>> {
    let pe_id = ids[0];
    let codec = Codec::default();
    let listener = reuse_socket();
    listener
        .bind(&SocketAddr::new(ip.parse().unwrap(), 0).into())
        .unwrap();
    listener.listen(16).unwrap();
    let local = listener.local_addr().unwrap();
    let conn = reuse_socket();
    conn.bind(&local).unwrap();
    conn.connect(&home.asap.into()).unwrap();
    let mut conn: TcpStream = conn.into();
    for &id in ids {
        let element = PoolElement {
            id: PoolElementId(id),
            home_registrar: RegistrarId(0),
            registration_life: RegistrationLife::Finite(Duration::from_secs(300)),
            user_transport: UserTransport::Address(TransportAddress::tcp(
                7,
                local.as_socket().unwrap().ip(),
            )),
            policy: PoolPolicy::RoundRobin,
            asap_transport: None,
        };
        let m = AsapMessage::Registration(asap::Registration {
            pool_handle: PoolHandle::from(pool),
            pool_element: element,
        });
        conn.write_all(&frame(11, &codec.encode(&m).unwrap()))
            .unwrap();
    }
    let homes = Arc::new(Mutex::new(Vec::new()));
    let h = homes.clone();
    std::thread::spawn(move || serve_pe(conn, codec, pe_id, h));
    let listener: std::net::TcpListener = listener.into();
    let h = homes.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let h = h.clone();
            std::thread::spawn(move || serve_pe(s, codec, pe_id, h));
        }
    });
    homes
}
