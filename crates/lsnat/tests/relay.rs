//! The gateway over loopback with real sockets: TCP and UDP binding and unbinding, a member
//! killed (SIGKILL) or stopped (SIGSTOP) in a child process, recovery with slow start, draining
//! through the member source, limits, connect failures, and the status endpoint.

use rserpool_lsnat::core::member::MemberSpec;
use rserpool_lsnat::core::receipt::{Outcome, Receipt};
use rserpool_lsnat::core::{Protocol, Status};
use rserpool_lsnat::source::{ChannelSource, SourceUpdate};
use rserpool_lsnat::{start, Config, Overrides, Running, StaticSource};
use rserpool_testkit::{http, wait_for};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

const WAIT: Duration = Duration::from_secs(10);

/// An in-process TCP echo server that can be told to stop answering (it keeps accepting and
/// reading, as a wedged application does).
struct Echo {
    addr: SocketAddr,
    mute: Arc<AtomicBool>,
    data_conns: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo() -> Echo {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mute = Arc::new(AtomicBool::new(false));
    let data_conns = Arc::new(AtomicUsize::new(0));
    let (m, d) = (mute.clone(), data_conns.clone());
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            let (m, d) = (m.clone(), d.clone());
            conns.spawn(async move {
                let mut buf = [0u8; 4096];
                let mut first = true;
                loop {
                    let n = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if first {
                        first = false;
                        d.fetch_add(1, Ordering::SeqCst);
                    }
                    if !m.load(Ordering::SeqCst) && s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Echo {
        addr,
        mute,
        data_conns,
        task,
    }
}

/// A TCP echo server in a child process (this test binary, re-run as `child_backend`), so it
/// can be killed with SIGKILL or stopped with SIGSTOP.
struct ChildBackend {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ChildBackend {
    fn drop(&mut self) {
        signal(&self.child, libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn child_backend_spawn() -> ChildBackend {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_backend",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("LSNAT_CHILD_BACKEND", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning the child backend");
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let port: u16 = loop {
        let line = lines.next().expect("child backend output").unwrap();
        if let Some(i) = line.find("LSNAT_CHILD_PORT=") {
            break line[i + "LSNAT_CHILD_PORT=".len()..]
                .trim()
                .parse()
                .unwrap();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    ChildBackend {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    }
}

/// Not a test of its own: the body of the child backend process.
#[test]
fn child_backend() {
    if std::env::var("LSNAT_CHILD_BACKEND").is_err() {
        return;
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    println!("LSNAT_CHILD_PORT={}", l.local_addr().unwrap().port());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            let Ok(mut r) = s.try_clone() else { return };
            let _ = std::io::copy(&mut r, &mut s);
        });
    }
}

fn config(members: &[SocketAddr], extra: &str) -> Config {
    let list: Vec<String> = members
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    let text = format!(
        "metrics = \"127.0.0.1:0\"\n[[listener]]\naddress = \"127.0.0.1:0\"\n[[listener]]\naddress = \"127.0.0.1:0\"\nprotocol = \"udp\"\n[pool]\nmembers = [{}]\n{extra}",
        list.join(", ")
    );
    Config::from_toml(&text, "test", &Overrides::default()).unwrap()
}

async fn gateway(members: &[SocketAddr], extra: &str) -> Running {
    let c = config(members, extra);
    let src = Box::new(StaticSource::new(c.members.clone()));
    start(c, src).await.unwrap()
}

async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    s.write_all(msg).await?;
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .map_err(|_| std::io::Error::other("no echo"))??;
    assert_eq!(got, msg);
    Ok(())
}

fn member_state(st: &Status, addr: SocketAddr) -> &'static str {
    st.members
        .iter()
        .find(|m| m.address == addr)
        .map(|m| m.state)
        .unwrap_or("absent")
}

/// Receipts (live and ended) of sessions whose first connect failed and that were bound again.
fn rebound(st: &Status) -> Vec<&Receipt> {
    st.bindings
        .iter()
        .map(|b| &b.receipt)
        .chain(st.recent_outcomes.iter())
        .filter(|r| !r.failed_attempts.is_empty())
        .collect()
}

fn outcomes_of(st: &Status, addr: SocketAddr) -> Vec<Outcome> {
    st.recent_outcomes
        .iter()
        .filter(|r| r.bound.as_ref().is_some_and(|b| b.address == addr))
        .filter_map(|r| r.outcome.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_sessions_bind_relay_half_close_and_unbind() {
    tcp_relay_case("[health]\nprobe = \"none\"\n[runtime]\nsplice = false\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_relay_with_splice_behaves_the_same() {
    tcp_relay_case("[health]\nprobe = \"none\"\n[runtime]\nsplice = true\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_transfers_arrive_intact_and_counted_with_and_without_splice() {
    for splice in [false, true] {
        let a = echo().await;
        let gw = gateway(
            &[a.addr],
            &format!(
                "[health]\nprobe = \"none\"\n[runtime]\nsplice = {splice}\nbuffer-size = 4096\n"
            ),
        )
        .await;
        let vip = gw.listener(Protocol::Tcp).unwrap();
        let s = TcpStream::connect(vip).await.unwrap();
        let (mut r, mut w) = s.into_split();
        const LEN: usize = 3 << 20;
        let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::with_capacity(LEN);
        tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        writer.await.unwrap();
        assert!(got == data, "payload corrupted (splice = {splice})");
        wait_for("the session's outcome", WAIT, || {
            !gw.status().recent_outcomes.is_empty()
        })
        .await;
        let st = gw.status();
        let r = &st.recent_outcomes[0];
        assert_eq!(r.outcome, Some(Outcome::Closed));
        assert_eq!(
            (r.bytes_to_member, r.bytes_to_client),
            (LEN as u64, LEN as u64)
        );
        gw.shutdown().await;
    }
}

/// A member that answers each byte a connection sends it with `chunk` bytes of a pattern, and
/// closes after `rounds` answers: once a chunk is sent it waits, so the gateway gets no new
/// data (and no new event) from it until the client has had the whole chunk.
async fn streamer(chunk: usize, rounds: usize) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                for round in 0..rounds {
                    let mut go = [0u8; 1];
                    if s.read_exact(&mut go).await.is_err() {
                        return;
                    }
                    let data: Vec<u8> = (0..chunk).map(|i| pattern(round * chunk + i)).collect();
                    if s.write_all(&data).await.is_err() {
                        return;
                    }
                }
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, task)
}

fn pattern(i: usize) -> u8 {
    (i * 13 + i / 4093) as u8
}

/// A spliced direction whose destination keeps filling up (a client with a small window that
/// reads in bursts) runs through the pipe's top-up; with a one-page pipe (a fill can meet a
/// full pipe at any time), the default and a large one, every byte of every answer arrives
/// once and in order, and is counted. The member sends nothing more until the client has a
/// whole answer: bytes the gateway left in its socket would never be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spliced_bulk_reaches_a_slow_reader_intact_whatever_the_pipe_size() {
    const CHUNK: usize = 4 << 20;
    const ROUNDS: usize = 3;
    for pipe in [4096usize, 262_144, 1 << 20] {
        let (member, task) = streamer(CHUNK, ROUNDS).await;
        let gw = gateway(
            &[member],
            &format!(
                "[health]\nprobe = \"none\"\n[runtime]\nsplice = true\nbuffer-size = 4096\npipe-size = {pipe}\n"
            ),
        )
        .await;
        // A small receive buffer (no autotuning): the gateway's socket to us fills at once.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(32 << 10).unwrap();
        let mut s = socket
            .connect(gw.listener(Protocol::Tcp).unwrap())
            .await
            .unwrap();
        let mut got = Vec::with_capacity(CHUNK * ROUNDS);
        let mut buf = vec![0u8; 32 << 10];
        let read_all = async {
            for _ in 0..ROUNDS {
                s.write_all(b"g").await.unwrap();
                let (mut this, mut since_pause) = (0, 0);
                while this < CHUNK {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the gateway closed early (pipe-size = {pipe})");
                    got.extend_from_slice(&buf[..n]);
                    this += n;
                    since_pause += n;
                    // Let the gateway's socket to us fill up now and then.
                    if since_pause >= 256 << 10 {
                        since_pause = 0;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            assert_eq!(s.read(&mut buf).await.unwrap(), 0, "no end of stream");
        };
        tokio::time::timeout(Duration::from_secs(30), read_all)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the transfer stalled after {} bytes (pipe-size = {pipe})",
                    got.len()
                )
            });
        assert_eq!(got.len(), CHUNK * ROUNDS, "pipe-size = {pipe}");
        let bad = got.iter().enumerate().position(|(i, b)| *b != pattern(i));
        assert_eq!(bad, None, "payload corrupted (pipe-size = {pipe})");
        drop(s);
        wait_for("the session's outcome", WAIT, || {
            !gw.status().recent_outcomes.is_empty()
        })
        .await;
        let st = gw.status();
        let r = &st.recent_outcomes[0];
        assert_eq!(
            (r.bytes_to_member, r.bytes_to_client),
            (ROUNDS as u64, (CHUNK * ROUNDS) as u64)
        );
        gw.shutdown().await;
        task.abort();
    }
}

async fn tcp_relay_case(extra: &str) {
    let (a, b) = (echo().await, echo().await);
    let gw = gateway(&[a.addr, b.addr], extra).await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    for i in 0..4 {
        let mut c = TcpStream::connect(vip).await.unwrap();
        roundtrip(&mut c, format!("hello {i}").as_bytes())
            .await
            .unwrap();
        // Half-close from the client: the member sees EOF, closes, and the client sees EOF.
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty());
    }
    wait_for("four closed sessions", WAIT, || {
        gw.status()
            .recent_outcomes
            .iter()
            .filter(|r| r.outcome == Some(Outcome::Closed))
            .count()
            == 4
    })
    .await;
    assert_eq!(a.data_conns.load(Ordering::SeqCst), 2);
    assert_eq!(b.data_conns.load(Ordering::SeqCst), 2);
    let st = gw.status();
    assert_eq!(st.active_sessions, 0);
    for r in &st.recent_outcomes {
        assert!(r.reached_ms.is_some() && r.connected_ms.is_some());
        assert_eq!(r.bytes_to_member, 7);
        assert_eq!(r.bytes_to_client, 7);
    }
    let m = gw.metrics();
    assert!(
        m.contains(&format!(
            "rserpool_lsnat_member_reached_total{{member=\"{}\"}} 2",
            a.addr
        )),
        "{m}"
    );
    assert!(m.contains("rserpool_lsnat_outcomes_total{outcome=\"closed\"} 4"));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_virtual_address_relays_to_ipv4_members() {
    let a = echo().await;
    let text = format!(
        "[[listener]]\naddress = \"[::1]:0\"\n[pool]\nmembers = [{{ address = \"{}\" }}]\n[health]\nprobe = \"none\"\n",
        a.addr
    );
    let c = Config::from_toml(&text, "test", &Overrides::default()).unwrap();
    let src = Box::new(StaticSource::new(c.members.clone()));
    let gw = match start(c, src).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipping: no IPv6 loopback here ({e})");
            return;
        }
    };
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut s = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut s, b"over v6").await.unwrap();
    drop(s);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_bind_per_client_and_end_by_idle_timer() {
    async fn udp_echo() -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let a = s.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = s.recv_from(&mut buf).await {
                let _ = s.send_to(&buf[..n], from).await;
            }
        });
        a
    }
    let (a, b) = (udp_echo().await, udp_echo().await);
    let gw = gateway(
        &[a, b],
        "[health]\nprobe = \"none\"\n[timers]\nudp = \"400ms\"\n",
    )
    .await;
    let vip = gw.listener(Protocol::Udp).unwrap();
    let c1 = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let c2 = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for (c, msg) in [(&c1, b"one".as_slice()), (&c2, b"two"), (&c1, b"uno")] {
        c.send_to(msg, vip).await.unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), c.recv_from(&mut buf))
            .await
            .expect("udp echo through the gateway")
            .unwrap();
        assert_eq!(&buf[..n], msg);
        assert_eq!(from, vip, "replies come from the virtual address");
    }
    let st = gw.status();
    assert_eq!(st.active_sessions, 2, "one flow per client address");
    let members: Vec<SocketAddr> = st
        .bindings
        .iter()
        .map(|b| b.receipt.bound.as_ref().unwrap().address)
        .collect();
    assert!(members.contains(&a) && members.contains(&b), "{members:?}");
    wait_for("both flows to idle out", WAIT, || {
        gw.status().active_sessions == 0
    })
    .await;
    let st = gw.status();
    let idle = st
        .recent_outcomes
        .iter()
        .filter(|r| r.outcome == Some(Outcome::IdleTimeout { state: "udp" }))
        .count();
    assert_eq!(idle, 2);
    // The same client again is a new flow.
    c1.send_to(b"again", vip).await.unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), c1.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"again");
    assert!(gw
        .metrics()
        .contains("rserpool_lsnat_sessions_opened_total 3"));
    gw.shutdown().await;
}

const FAST_PROBES: &str = "[health]\ninterval = \"100ms\"\ntimeout = \"300ms\"\nfall = 2\nrise = 2\nslow-start = \"500ms\"\nsend = \"ping\\n\"\nexpect = \"ping\"\n";

/// Connects until a session lands on `target`; returns that connection (echo checked).
async fn session_on(gw: &Running, target: SocketAddr) -> TcpStream {
    let vip = gw.listener(Protocol::Tcp).unwrap();
    for _ in 0..10 {
        let mut s = TcpStream::connect(vip).await.unwrap();
        roundtrip(&mut s, b"probe me").await.unwrap();
        let on_target = gw.status().bindings.iter().any(|b| {
            b.receipt.bound.as_ref().unwrap().address == target
                && b.receipt.client == s.local_addr().unwrap()
        });
        if on_target {
            return s;
        }
    }
    panic!("no session landed on {target}");
}

async fn new_sessions_avoid(gw: &Running, dead: SocketAddr, n: usize) {
    let vip = gw.listener(Protocol::Tcp).unwrap();
    for i in 0..n {
        let mut s = TcpStream::connect(vip).await.unwrap();
        roundtrip(&mut s, format!("after {i}").as_bytes())
            .await
            .unwrap();
        let bound_to = gw
            .status()
            .bindings
            .iter()
            .find(|b| b.receipt.client == s.local_addr().unwrap())
            .map(|b| b.receipt.bound.as_ref().unwrap().address);
        assert_ne!(
            bound_to,
            Some(dead),
            "a new session was bound to the dead member"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_member_gets_no_new_bindings_and_its_sessions_are_lost() {
    let child = child_backend_spawn();
    let other = echo().await;
    let gw = gateway(&[child.addr, other.addr], FAST_PROBES).await;
    let mut held = session_on(&gw, child.addr).await;
    let t0 = Instant::now();
    let mut child = child;
    child.child.kill().unwrap();
    let _ = child.child.wait();
    wait_for("the killed member to be judged dead", WAIT, || {
        member_state(&gw.status(), child.addr) == "dead"
    })
    .await;
    let detected = t0.elapsed();
    // interval 100 ms × fall 2 + timeout: well under the generous bound.
    assert!(detected < Duration::from_secs(5), "{detected:?}");
    wait_for("the held session's outcome", WAIT, || {
        !outcomes_of(&gw.status(), child.addr).is_empty()
    })
    .await;
    let outcomes = outcomes_of(&gw.status(), child.addr);
    assert!(
        matches!(outcomes.last(), Some(Outcome::MemberLost { .. })),
        "{outcomes:?}"
    );
    assert!(
        !outcomes.contains(&Outcome::Closed),
        "a lost session is never counted as completed"
    );
    // The client side is closed promptly.
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), held.read(&mut buf)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
    new_sessions_avoid(&gw, child.addr, 6).await;
    let m = gw.metrics();
    assert!(
        m.contains(&format!(
            "rserpool_lsnat_member_outcomes_total{{member=\"{}\",outcome=\"member_lost\"}} 1",
            child.addr
        )),
        "{m}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_member_is_judged_dead_then_returns_with_slow_start() {
    let child = child_backend_spawn();
    let other = echo().await;
    let gw = gateway(&[child.addr, other.addr], FAST_PROBES).await;
    let mut held = session_on(&gw, child.addr).await;
    signal(&child.child, libc::SIGSTOP);
    // kill(2) returns before the process has stopped: wait until it has.
    let stat = format!("/proc/{}/stat", child.child.id());
    wait_for("the child to stop", WAIT, || {
        std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    })
    .await;
    // The stopped process's kernel still accepts connections; the probe's expected reply
    // never comes, and that is the evidence.
    held.write_all(b"anyone there?").await.unwrap();
    wait_for("the stopped member to be judged dead", WAIT, || {
        member_state(&gw.status(), child.addr) == "dead"
    })
    .await;
    wait_for("the held session to be reported lost", WAIT, || {
        matches!(
            outcomes_of(&gw.status(), child.addr).last(),
            Some(Outcome::MemberLost { .. })
        )
    })
    .await;
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), held.read(&mut buf)).await;
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "client side closed: {r:?}"
    );
    new_sessions_avoid(&gw, child.addr, 4).await;
    // Resume: probes pass again, probation (slow start), then alive and chosen again.
    signal(&child.child, libc::SIGCONT);
    wait_for("probation", WAIT, || {
        matches!(
            member_state(&gw.status(), child.addr),
            "probation" | "alive"
        )
    })
    .await;
    wait_for("alive", WAIT, || {
        member_state(&gw.status(), child.addr) == "alive"
    })
    .await;
    let back = session_on(&gw, child.addr).await;
    drop(back);
    let transitions = gw.metrics();
    assert!(
        transitions.contains(&format!(
            "rserpool_lsnat_member_transitions_total{{member=\"{}\",to=\"probation\"}} 1",
            child.addr
        )),
        "{transitions}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_member_keeps_bound_sessions_and_gets_no_new_ones() {
    let (a, b) = (echo().await, echo().await);
    let c = config(&[a.addr, b.addr], "[health]\nprobe = \"none\"\n");
    let (tx, src) = ChannelSource::new();
    tx.send(SourceUpdate::Members(c.members.clone()))
        .await
        .unwrap();
    let gw = start(c, Box::new(src)).await.unwrap();
    let mut held = session_on(&gw, a.addr).await;
    tx.send(SourceUpdate::Members(vec![
        MemberSpec::new(a.addr).weight(0),
        MemberSpec::new(b.addr),
    ]))
    .await
    .unwrap();
    wait_for("draining", WAIT, || {
        member_state(&gw.status(), a.addr) == "draining"
    })
    .await;
    new_sessions_avoid(&gw, a.addr, 4).await;
    roundtrip(&mut held, b"still served").await.unwrap();
    drop(held);
    wait_for("the drained session to close", WAIT, || {
        outcomes_of(&gw.status(), a.addr).contains(&Outcome::Closed)
    })
    .await;
    // The source removes the member: it leaves once it has no sessions.
    tx.send(SourceUpdate::Members(vec![MemberSpec::new(b.addr)]))
        .await
        .unwrap();
    wait_for("removal", WAIT, || {
        member_state(&gw.status(), a.addr) == "absent"
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_over_the_limit_are_refused_and_counted() {
    let a = echo().await;
    let gw = gateway(
        &[a.addr],
        "[health]\nprobe = \"none\"\n[limits]\nmax-sessions = 2\n",
    )
    .await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut s1 = TcpStream::connect(vip).await.unwrap();
    let mut s2 = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut s1, b"1").await.unwrap();
    roundtrip(&mut s2, b"2").await.unwrap();
    // The gateway accepts and resets at once: the reset may even beat the connect's return.
    if let Ok(mut s3) = TcpStream::connect(vip).await {
        let _ = s3.write_all(b"3").await;
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_secs(5), s3.read(&mut buf)).await;
        assert!(
            matches!(r, Ok(Ok(0)) | Ok(Err(_))),
            "refused connection is closed: {r:?}"
        );
    }
    wait_for("the refusal", WAIT, || {
        gw.status().recent_outcomes.len() == 1
    })
    .await;
    let m = gw.metrics();
    assert!(
        m.contains("rserpool_lsnat_refused_total{reason=\"max_sessions\"} 1"),
        "{m}"
    );
    let st = gw.status();
    assert!(st
        .recent_outcomes
        .iter()
        .any(|r| matches!(r.outcome, Some(Outcome::Refused { .. })) && r.bound.is_none()));
    // Room again once a session ends.
    drop(s1);
    wait_for("a free slot", WAIT, || gw.status().active_sessions == 1).await;
    let mut s4 = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut s4, b"4").await.unwrap();
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connects_rebind_elsewhere_and_count_against_the_member() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let b = echo().await;
    let gw = gateway(&[closed, b.addr], "[health]\nprobe = \"none\"\nfall = 2\n").await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    for i in 0..4 {
        let mut s = TcpStream::connect(vip).await.unwrap();
        roundtrip(&mut s, format!("{i}").as_bytes()).await.unwrap();
    }
    let st = gw.status();
    assert_eq!(member_state(&st, closed), "dead");
    let rebound = rebound(&st);
    assert_eq!(
        rebound.len(),
        2,
        "two sessions were rebound before the member was judged dead"
    );
    for r in rebound {
        assert_eq!(r.selected.len(), 2);
        assert_eq!(r.failed_attempts[0].reason, "connection refused");
        assert_eq!(r.bound.as_ref().unwrap().address, b.addr);
    }
    gw.shutdown().await;
}

/// A listener that never accepts, its accept queue filled by the connections returned: the
/// kernel drops the SYNs that come next (the client sends them again, a second later first).
fn full_listener() -> (socket2::Socket, SocketAddr, Vec<std::net::TcpStream>) {
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let queued: Vec<_> = (0..2)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
        })
        .collect();
    assert!(!queued.is_empty(), "the accept queue could not be filled");
    (l, addr, queued)
}

/// A member whose accept queue is full drops SYNs: the relay's connect deadline (not the
/// kernel's minutes of SYN retries) ends the attempt, and the session is bound elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_times_out_rebinds_elsewhere() {
    let (_silent, silent_addr, _queued) = full_listener();
    let b = echo().await;
    let gw = gateway(
        &[silent_addr, b.addr],
        "policy = \"round-robin\"\n[timers]\nconnect = \"300ms\"\n[health]\nprobe = \"none\"\nfall = 10\n",
    )
    .await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    for i in 0..2 {
        let mut s = TcpStream::connect(vip).await.unwrap();
        let started = Instant::now();
        roundtrip(&mut s, format!("{i}").as_bytes()).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the deadline ended the connect"
        );
    }
    let st = gw.status();
    let rebound = rebound(&st);
    // Round robin: each session tries the silent member, first or after the echo's turn.
    assert!(
        !rebound.is_empty(),
        "a session went to the silent member first"
    );
    for r in rebound {
        assert_eq!(r.failed_attempts[0].reason, "connect timed out after 300ms");
        assert_eq!(r.failed_attempts[0].member, r.selected[0].member);
        assert_eq!(r.bound.as_ref().unwrap().address, b.addr);
    }
    gw.shutdown().await;
}

/// A gateway dropped without `shutdown` still stops its relay worker threads: the port closes
/// and a session open at the time is closed, not left to a thread that runs forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_gateway_stops_its_relay_workers() {
    let b = echo().await;
    let gw = gateway(&[b.addr], "[health]\nprobe = \"none\"\n").await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut open = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut open, b"before").await.unwrap();
    drop(gw);
    rserpool_testkit::until(
        "the listener to close",
        Duration::from_secs(5),
        async || TcpStream::connect(vip).await.is_err(),
    )
    .await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), open.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the open session was closed within the grace time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_endpoint_serves_json_and_prometheus_text() {
    let a = echo().await;
    a.mute.store(false, Ordering::SeqCst);
    let gw = gateway(&[a.addr], "[health]\nprobe = \"none\"\n").await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut s = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut s, b"x").await.unwrap();
    let http = gw.status_address().unwrap();
    let status = http::get(http, "/status").await.unwrap();
    assert!(status.status_line.starts_with("HTTP/1.1 200"));
    assert!(
        status.head.contains("content-type: application/json"),
        "{status:?}"
    );
    let body = &status.body;
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["active_sessions"], 1);
    assert_eq!(
        v["bindings"][0]["receipt"]["bound"]["address"],
        a.addr.to_string()
    );
    assert_eq!(v["members"][0]["state"], "alive");
    // Documented fields, plain values: a cost is a number (or "unreachable").
    assert_eq!(v["members"][0]["cost"], 0, "{}", v["members"][0]);
    let health = http::get(http, "/healthz").await.unwrap();
    assert!(
        health.status_line.starts_with("HTTP/1.1 200") && health.body.ends_with("ok\n"),
        "{health:?}"
    );
    let answer = http::get(http, "/metrics").await.unwrap();
    assert!(
        answer
            .head
            .contains("application/openmetrics-text; version=1.0.0"),
        "{answer:?}"
    );
    let metrics = &answer.body;
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
    for family in [
        "rserpool_lsnat_member_selected_total",
        "rserpool_lsnat_member_bound_total",
        "rserpool_lsnat_member_reached_total",
        "rserpool_lsnat_outcomes_total",
        "rserpool_lsnat_refused_total",
    ] {
        // OpenMetrics names a counter's family without `_total`; its samples carry it.
        let base = family.trim_end_matches("_total");
        assert!(
            metrics.contains(&format!("# TYPE {base} counter\n")),
            "{family}"
        );
        assert!(metrics.contains(&format!("\n{family}{{")), "{family}");
    }
    assert!(http::get(http, "/nope")
        .await
        .unwrap()
        .status_line
        .starts_with("HTTP/1.1 404"));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tcp_session_is_closed_by_its_timer() {
    let a = echo().await;
    let gw = gateway(
        &[a.addr],
        "[health]\nprobe = \"none\"\n[timers]\ntcp-established = \"300ms\"\n",
    )
    .await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut s = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut s, b"then silence").await.unwrap();
    let mut buf = [0u8; 4];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
    let st = gw.status();
    assert_eq!(
        st.recent_outcomes[0].outcome,
        Some(Outcome::IdleTimeout {
            state: "established"
        })
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_reset_is_recorded_as_reset_and_passed_on() {
    // A backend that answers once, then resets the connection.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let backend = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            let mut buf = [0u8; 64];
            let Ok(n) = s.read(&mut buf).await else {
                continue;
            };
            let _ = s.write_all(&buf[..n]).await;
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            drop(s);
        }
    });
    let gw = gateway(&[addr], "[health]\nprobe = \"none\"\n").await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut c = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut c, b"then reset").await.unwrap();
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await;
    assert!(
        matches!(&r, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the client sees a reset, not a clean close: {r:?}"
    );
    wait_for("the outcome", WAIT, || {
        !gw.status().recent_outcomes.is_empty()
    })
    .await;
    let st = gw.status();
    assert_eq!(
        st.recent_outcomes[0].outcome,
        Some(Outcome::Reset {
            by: rserpool_lsnat::core::receipt::Side::Member
        })
    );
    // The binding lingers (RFC 7857) without holding a session slot.
    assert_eq!((st.active_sessions, st.lingering), (0, 1));
    backend.abort();
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_datagrams_refused_by_the_member_end_the_flow_as_connect_failed() {
    let closed = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let gw = gateway(&[closed], "[health]\nprobe = \"none\"\nfall = 1\n").await;
    let vip = gw.listener(Protocol::Udp).unwrap();
    let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    c.send_to(b"hello?", vip).await.unwrap();
    wait_for("the flow's outcome", WAIT, || {
        !gw.status().recent_outcomes.is_empty()
    })
    .await;
    let st = gw.status();
    assert!(
        matches!(
            &st.recent_outcomes[0].outcome,
            Some(Outcome::ConnectFailed { reason }) if reason.contains("refused")
        ),
        "{:?}",
        st.recent_outcomes[0].outcome
    );
    assert!(st.recent_outcomes[0].reached_ms.is_none());
    assert_eq!(member_state(&st, closed), "dead");
    gw.shutdown().await;
}

/// The value of the first metrics line that starts with `prefix` (any metric prefix).
fn metric(text: &str, name_and_labels: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            name.ends_with(name_and_labels)
                .then(|| value.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no metric {name_and_labels} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_receipts_count_every_byte_of_short_and_long_flows() {
    let echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let member = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = echo.recv_from(&mut buf).await {
            let _ = echo.send_to(&buf[..n], from).await;
        }
    });
    // Idle timer 400 ms, so reports go every 50 ms: the long flow spans many reports, the short
    // ones end before their first report.
    let gw = gateway(
        &[member],
        "[health]\nprobe = \"none\"\n[timers]\nudp = \"400ms\"\n",
    )
    .await;
    let vip = gw.listener(Protocol::Udp).unwrap();
    let mut expected = Vec::new();
    // Two short flows (one datagram, then three), one long one (2 180 bytes over ~1 s).
    let flows: [Vec<usize>; 3] = [
        vec![100],
        vec![700, 500, 500],
        (0..40).map(|i| 40 + (i * 7) % 30).collect(),
    ];
    for sizes in &flows {
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut total = 0u64;
        for (i, &n) in sizes.iter().enumerate() {
            let msg = vec![b'a' + (i % 26) as u8; n];
            c.send_to(&msg, vip).await.unwrap();
            let mut buf = [0u8; 4096];
            let (got, _) = tokio::time::timeout(Duration::from_secs(5), c.recv_from(&mut buf))
                .await
                .expect("udp echo through the gateway")
                .unwrap();
            assert_eq!(got, n);
            total += n as u64;
            if sizes.len() > 10 {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        expected.push((c.local_addr().unwrap(), total));
    }
    wait_for("every flow to idle out", WAIT, || {
        gw.status().active_sessions == 0
    })
    .await;
    // Normally one receipt per flow; on a loaded machine a pause longer than the idle timer
    // inside the long flow ends it and the rest is a second flow: every byte is still counted
    // once, in one receipt or the other. The bytes relayed since the last report reach the
    // receipt just after the flow ends, so this is waited for too.
    let counted = |client: &SocketAddr| {
        let st = gw.status();
        let rs: Vec<_> = st
            .recent_outcomes
            .iter()
            .filter(|r| r.client == *client)
            .cloned()
            .collect();
        (
            rs.len(),
            rs.iter().map(|r| r.bytes_to_member).sum::<u64>(),
            rs.iter().map(|r| r.bytes_to_client).sum::<u64>(),
        )
    };
    let done = || {
        expected.iter().all(|(client, total)| {
            let (n, m, c) = counted(client);
            n > 0 && m == *total && c == *total
        })
    };
    if tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_err()
    {
        for (client, total) in &expected {
            let (n, m, c) = counted(client);
            assert_eq!((m, c), (*total, *total), "{n} receipts of {client}");
        }
    }
    let sum: u64 = expected.iter().map(|(_, t)| t).sum();
    assert_eq!(sum, 100 + 1700 + flows[2].iter().sum::<usize>() as u64);
    let m = gw.metrics();
    assert_eq!(metric(&m, "bytes_total{direction=\"to_member\"}"), sum);
    assert_eq!(metric(&m, "bytes_total{direction=\"to_client\"}"), sum);
    gw.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn worker_threads_share_the_port_serve_every_session_and_refuse_a_port_in_use() {
    let a = echo().await;
    // Four workers, each with its own socket on the virtual port (SO_REUSEPORT).
    let gw = gateway(
        &[a.addr],
        "[health]\nprobe = \"none\"\n[runtime]\nworker-threads = 4\n",
    )
    .await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    assert_ne!(vip.port(), 0);
    let mut clients = Vec::new();
    for i in 0..40u32 {
        clients.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(vip).await.unwrap();
            roundtrip(&mut s, format!("hello {i}").as_bytes())
                .await
                .unwrap();
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    wait_for("40 closed receipts", WAIT, || {
        gw.status()
            .recent_outcomes
            .iter()
            .filter(|r| r.outcome == Some(Outcome::Closed))
            .count()
            == 40
    })
    .await;
    // Another gateway on the same port is refused with the port named, not let in to share it.
    let c = config(
        &[a.addr],
        "[health]\nprobe = \"none\"\n[runtime]\nworker-threads = 2\n",
    );
    let mut c2 = c.clone();
    c2.listeners[0].address = vip;
    let e = match start(c2, Box::new(StaticSource::new(c.members.clone()))).await {
        Err(e) => e,
        Ok(_) => panic!("a second gateway bound {vip}"),
    };
    assert!(e.to_string().contains(&vip.to_string()), "{e}");
    // A session open at shutdown ends with outcome shutdown, and shutdown returns.
    let mut open = TcpStream::connect(vip).await.unwrap();
    roundtrip(&mut open, b"still here").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), gw.shutdown())
        .await
        .expect("shutdown returns");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf))
        .await
        .expect("the relay ends");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
}

/// The value of an unlabelled or one-labelled sample in a scrape.
fn sample(scrape: &str, name_and_labels: &str) -> Option<u64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Long-lived connections that arrive one at a time while the gateway is idle: the kernel
/// wakes the same waiting worker for each, so without a hand-over every one would be relayed
/// by worker 0 while worker 1 idles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lived_connections_spread_over_the_workers() {
    let a = echo().await;
    let gw = gateway(&[a.addr], "[runtime]\nworker-threads = 2\n").await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut held = Vec::new();
    for i in 0..10u8 {
        let mut s = TcpStream::connect(vip).await.unwrap();
        roundtrip(&mut s, &[i; 5]).await.unwrap();
        held.push(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = gw.metrics();
    let w0 = sample(&m, "rserpool_lsnat_relay_sessions{worker=\"0\"}").unwrap();
    let w1 = sample(&m, "rserpool_lsnat_relay_sessions{worker=\"1\"}").unwrap();
    assert_eq!(w0 + w1, 10, "{m}");
    assert!(w0.abs_diff(w1) <= 2, "sessions per worker {w0} / {w1}\n{m}");
    // Handed over, unless the kernel itself woke the other worker (when the first was busy).
    assert!(
        sample(&m, "rserpool_lsnat_relay_handovers_total").is_some(),
        "{m}"
    );
    // Every connection still relays, whichever worker holds it.
    for (i, s) in held.iter_mut().enumerate() {
        roundtrip(s, &[i as u8 + 100; 3]).await.unwrap();
    }
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while gw.status().active_sessions > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = gw.metrics();
    assert_eq!(
        sample(&m, "rserpool_lsnat_relay_sessions{worker=\"0\"}"),
        Some(0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "rserpool_lsnat_relay_sessions{worker=\"1\"}"),
        Some(0),
        "{m}"
    );
    assert!(
        m.contains("rserpool_lsnat_outcomes_total{outcome=\"closed\"} 10"),
        "{m}"
    );
    gw.shutdown().await;
}

/// The scheduling policy (sched(7) number) of every relay worker thread in this process.
#[cfg(target_os = "linux")]
fn worker_policies() -> Vec<i64> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("lsnat-worker-") {
            continue;
        }
        // Field 41 of stat; fields are counted from the one after the command's ")".
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if let Some(p) = rest.split_whitespace().nth(41 - 3) {
            out.push(p.parse().unwrap());
        }
    }
    out
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_workers_run_under_the_configured_scheduling_policy() {
    const SCHED_OTHER: i64 = libc::SCHED_OTHER as i64;
    const SCHED_BATCH: i64 = libc::SCHED_BATCH as i64;
    let e = echo().await;
    // The default: batch. (Other tests' gateways in this process run with the default too.)
    let gw = gateway(&[e.addr], "[runtime]\nworker-threads = 2\n").await;
    let mut s = TcpStream::connect(gw.listener(Protocol::Tcp).unwrap())
        .await
        .unwrap();
    roundtrip(&mut s, b"ping").await.unwrap();
    wait_for("the workers under SCHED_BATCH", WAIT, || {
        let p = worker_policies();
        p.len() >= 2 && p.iter().all(|&p| p == SCHED_BATCH)
    })
    .await;
    drop(s);
    gw.shutdown().await;
    // "normal" leaves the policy the process has: a worker under SCHED_OTHER appears.
    let gw = gateway(
        &[e.addr],
        "[runtime]\nworker-threads = 1\nscheduling = \"normal\"\n",
    )
    .await;
    let mut s = TcpStream::connect(gw.listener(Protocol::Tcp).unwrap())
        .await
        .unwrap();
    roundtrip(&mut s, b"ping").await.unwrap();
    wait_for("a worker under SCHED_OTHER", WAIT, || {
        worker_policies().contains(&SCHED_OTHER)
    })
    .await;
    drop(s);
    gw.shutdown().await;
}

/// A member that writes `len` bytes of a pattern on every connection and closes it at once.
async fn answer_and_close(len: usize) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let data: Vec<u8> = (0..len).map(pattern).collect();
                let _ = s.write_all(&data).await;
            });
        }
    });
    (addr, task)
}

/// Bytes read while the source's end is already known go out held for the end of stream that
/// follows (one segment with the FIN): whether the gateway passes the end on with a shutdown
/// (the client still sending) or by closing both sockets (the client had ended first), every
/// byte and then the end reach the client, short answers and long ones alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_followed_at_once_by_the_end_arrives_whole() {
    for len in [100usize, 200_000] {
        let (member, task) = answer_and_close(len).await;
        let gw = gateway(
            &[member],
            "[health]\nprobe = \"none\"\n[runtime]\nsplice = false\nbuffer-size = 1024\n",
        )
        .await;
        let vip = gw.listener(Protocol::Tcp).unwrap();
        let want: Vec<u8> = (0..len).map(pattern).collect();
        for round in 0..20 {
            let mut s = TcpStream::connect(vip).await.unwrap();
            let client_ends_first = round % 2 == 1;
            if client_ends_first {
                s.shutdown().await.unwrap();
            }
            let mut got = Vec::with_capacity(len);
            tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
                .await
                .unwrap_or_else(|_| panic!("no end after {} of {len} bytes", got.len()))
                .unwrap_or_else(|e| panic!("{len} bytes, round {round}: {e} after {}", got.len()));
            assert!(got == want, "{len} bytes, round {round}: payload differs");
        }
        wait_for("the sessions' outcomes", WAIT, || {
            gw.status().recent_outcomes.len() >= 20
        })
        .await;
        for r in &gw.status().recent_outcomes {
            assert_eq!(r.outcome, Some(Outcome::Closed), "{r:?}");
            assert_eq!(r.bytes_to_client, len as u64, "{r:?}");
        }
        gw.shutdown().await;
        task.abort();
    }
}

/// A handshake that is not over when connect returns (the member's accept queue is full, so
/// its SYN is dropped and sent again a second later) completes through the socket's event: the
/// bytes the client sent meanwhile wait in its socket and then reach the member, and the
/// answer comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_completes_later_carries_the_early_bytes() {
    let (slow, slow_addr, queued) = full_listener();
    let gw = gateway(
        &[slow_addr],
        "[timers]\nconnect = \"10s\"\n[health]\nprobe = \"none\"\n",
    )
    .await;
    let vip = gw.listener(Protocol::Tcp).unwrap();
    let mut c = TcpStream::connect(vip).await.unwrap();
    c.write_all(b"early").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.status().recent_outcomes.len(), 0);
    // Make room: the queued connections are taken, then the gateway's arrives.
    let member = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        for _ in 0..queued.len() {
            drop(slow.accept().unwrap());
        }
        drop(queued);
        let (s, _) = slow.accept().unwrap();
        let mut s: std::net::TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = [0u8; 5];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"late").unwrap();
        got
    });
    let mut answer = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    assert_eq!(&answer, b"late");
    assert_eq!(&member.await.unwrap(), b"early");
    let st = gw.status();
    assert!(rebound(&st).is_empty(), "no connect failed: {st:?}");
    drop(c);
    gw.shutdown().await;
}
