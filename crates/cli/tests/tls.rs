//! TLS end to end with the `rserpool` binary: a registrar configured from a TOML file with a
//! `[tls]` table, PEs and PUs with and without allowed certificates, the refusals counted in
//! the metrics, and clear errors for bad TLS options.

mod common;
#[path = "../../transport/tests/common/pki.rs"]
mod pki;

use common::process::{endpoint_of, run, word_after, Proc};
use pki::{server_names, Names, Pki};
use rserpool_endpoint::driver::RegistrarAccess;
use rserpool_testkit::{http, pe_config, registered_pe, LOCALHOST};
use rserpool_transport::TransportChoice;
use rserpool_wire::PoolPolicy;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: loaded CI machines.
const WAIT: Duration = Duration::from_secs(60);

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rserpool"))
}

/// A registrar process (killed when dropped) and its addresses.
struct Registrar {
    _process: Proc,
    asap: SocketAddr,
    metrics: SocketAddr,
}

impl Registrar {
    fn start(config: &Path) -> Registrar {
        let process = Proc::start(
            &["registrar", "--config", path(config), "--log", "warn"],
            None,
        );
        // "registrar $… serving ASAP over TCP with TLS on 127.0.0.1:PORT (…), metrics at http://ADDR/metrics"
        let asap = word_after(&process.wait_for(" over TCP with TLS on "), "with TLS on ");
        let metrics = endpoint_of(&process);
        Registrar {
            _process: process,
            asap: asap.parse().unwrap(),
            metrics: metrics.parse().unwrap(),
        }
    }

    fn metrics(&self) -> String {
        http::get_blocking(self.metrics, "/metrics").unwrap().body
    }

    /// Waits until the metric (name with labels) reaches `at_least`.
    fn wait_metric(&self, metric: &str, at_least: u64) {
        let until = Instant::now() + WAIT;
        loop {
            let m = self.metrics();
            let value = m.lines().find_map(|l| {
                l.strip_prefix(metric)?
                    .strip_prefix(' ')?
                    .parse::<u64>()
                    .ok()
            });
            if value.is_some_and(|v| v >= at_least) {
                return;
            }
            assert!(Instant::now() < until, "{metric} not at {at_least} in\n{m}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn registrar_pe_and_pu_with_tls_from_the_command_line() {
    let pki = Pki::new("ca");
    let (rc, rk) = pki.issue("registrar", server_names());
    let config = pki.dir.path().join("registrar.toml");
    std::fs::write(
        &config,
        format!(
            r#"transport = "tcp"
asap = ["127.0.0.1:0"]
asap-announce = "off"
metrics = "127.0.0.1:0"
min-address-scope = "loopback"

[tls]
cert = "{}"
key = "{}"
ca = "{}"
handshake-timeout = "10s"
unauthenticated-resolve = false
enrp-peers = ["dns:registrar-*.test"]

[[tls.register]]
identity = "dns:*.echo.test"
pools = ["EchoPool"]
"#,
            path(&rc),
            path(&rk),
            path(&pki.ca)
        ),
    )
    .unwrap();
    let registrar = Registrar::start(&config);
    let target = registrar.asap.to_string();
    let ca = path(&pki.ca).to_owned();

    // `rserpool bench` registers its PEs at setup: with a certificate not allowed for the pool
    // none is accepted, and the registrar counts the refusal.
    let (cc, ck) = pki.issue(
        "calc",
        Names {
            cn: "calc-1",
            dns: &["c1.calc.test"],
            ..Names::default()
        },
    );
    let bench = |cert: &Path, key: &Path| {
        run(&[
            "bench",
            "--registrar",
            &target,
            "--transport",
            "tcp",
            "--pes",
            "2",
            "--pool",
            "EchoPool",
            "--associations",
            "1",
            "--seconds",
            "0.2",
            "--workloads",
            "resolve",
            "--tls-ca",
            &ca,
            "--tls-cert",
            path(cert),
            "--tls-key",
            path(key),
            "--tls-server-name",
            "registrar.test",
        ])
    };
    let (ok, out, err) = bench(&cc, &ck);
    assert!(!ok, "{out}");
    assert!(err.contains("the registrar accepted no PE"), "{err}");
    assert!(out.contains("0 of 2 PEs registered"), "{out}");
    registrar.wait_metric(
        "rserpool_registrar_access_refused_total{reason=\"pool_not_allowed\"}",
        2,
    );
    // An allowed certificate: registered and resolved under load.
    let (ec, ek) = pki.issue(
        "echo",
        Names {
            cn: "echo-1",
            dns: &["e1.echo.test"],
            ..Names::default()
        },
    );
    let (ok, out, err) = bench(&ec, &ek);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("2 of 2 PEs registered"), "{out}");

    // A PE that stays registered (the PE driver of rserpool-endpoint with the same settings the
    // CLI builds), then `rserpool resolve` with and without a certificate.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut access = RegistrarAccess::single(registrar.asap, TransportChoice::Tcp);
    access.endpoint.tls = Some(pki.anonymous().with_identity(&ec, &ek));
    let at = SocketAddr::new(LOCALHOST, 7777);
    let pe = rt
        .block_on(registered_pe(
            access,
            pe_config("EchoPool", at, PoolPolicy::RoundRobin),
            WAIT,
        ))
        .unwrap();

    let (pc, pk) = pki.issue(
        "pu",
        Names {
            cn: "pu-1",
            ..Names::default()
        },
    );
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "resolve",
            "EchoPool",
            "--registrar",
            &target,
            "--transport",
            "tcp",
            "--timeout",
            "10000",
            "--tls-ca",
            &ca,
            "--tls-handshake-timeout",
            "10s",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let (ok, out, err) = resolve(&["--tls-cert", path(&pc), "--tls-key", path(&pk)]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("pool EchoPool: 1 PE(s) selected"), "{out}");
    assert!(out.contains("7777"), "{out}");
    let (ok, out, err) = resolve(&[]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("pool EchoPool: the registrar answered"),
        "{err}"
    );
    registrar.wait_metric(
        "rserpool_registrar_access_refused_total{reason=\"resolution_without_identity\"}",
        1,
    );
    // A server name the registrar's certificate does not carry: no registrar is reached.
    let (ok, _, err) = resolve(&[
        "--tls-cert",
        path(&pc),
        "--tls-key",
        path(&pk),
        "--tls-server-name",
        "elsewhere.test",
    ]);
    assert!(!ok);
    assert!(err.contains("could be reached with TLS"), "{err}");
    assert!(err.contains("not valid for name"), "{err}");
    // A client trusting another CA: its handshake fails (and the registrar counts the alert).
    let rogue = Pki::new("rogue");
    let (ok, _, err) = run(&[
        "resolve",
        "EchoPool",
        "--registrar",
        &target,
        "--transport",
        "tcp",
        "--timeout",
        "3000",
        "--tls-ca",
        path(&rogue.ca),
    ]);
    assert!(!ok);
    assert!(err.contains("UnknownIssuer"), "{err}");
    registrar.wait_metric("rserpool_registrar_tls_handshake_failures_total", 2);
    drop(pe);
}

#[test]
fn bad_tls_options_are_named() {
    let pki = Pki::new("ca");
    let (c, k) = pki.issue("registrar", server_names());
    let err = |args: &[&str]| {
        let (ok, out, err) = run(args);
        assert!(!ok, "{out}");
        err
    };
    let e = err(&["registrar", "--tls-cert", path(&c), "--tls-key", path(&k)]);
    assert!(e.contains("--tls-ca: required"), "{e}");
    let e = err(&[
        "registrar",
        "--transport",
        "sctp",
        "--tls-cert",
        path(&c),
        "--tls-key",
        path(&k),
        "--tls-ca",
        path(&pki.ca),
    ]);
    assert!(e.contains("TLS over kernel SCTP is not supported"), "{e}");
    assert!(e.contains("TCP mapping with TLS"), "{e}");
    let e = err(&["registrar", "--tls-ca", path(&pki.ca)]);
    assert!(e.contains("needs its own certificate and key"), "{e}");
    let e = err(&[
        "registrar",
        "--tls-register",
        "*=EchoPool",
        "--asap-announce",
        "off",
    ]);
    assert!(e.contains("TLS is not"), "{e}");
    let e = err(&[
        "resolve",
        "P",
        "--registrar",
        "127.0.0.1:1",
        "--tls-ca",
        path(&pki.ca),
        "--tls-handshake-timeout",
        "5x",
    ]);
    assert!(e.contains("--tls-handshake-timeout"), "{e}");
    let e = err(&[
        "bench",
        "--registrar",
        "127.0.0.1:1",
        "--tls-ca",
        path(&pki.ca),
    ]);
    assert!(e.contains("TLS over kernel SCTP is not supported"), "{e}");
    let e = err(&[
        "resolve",
        "P",
        "--registrar",
        "127.0.0.1:1",
        "--transport",
        "tcp",
        "--tls-ca",
        "/nonexistent/ca.pem",
    ]);
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
}

/// A registrar with TLS and ENRP: its process, its ASAP-side metrics address and its ENRP
/// address, read from the lines it prints when it serves.
fn enrp_registrar(
    pki: &Pki,
    stem: &str,
    dns: &'static [&'static str],
    peer: Option<SocketAddr>,
) -> (Registrar, SocketAddr) {
    const IPS: &[std::net::IpAddr] = &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)];
    let (cert, key) = pki.issue(
        stem,
        Names {
            cn: stem,
            dns,
            uris: &[],
            ips: IPS,
        },
    );
    let config = pki.dir.path().join(format!("{stem}.toml"));
    let peers = peer
        .map(|p| format!("peers = [\"{p}\"]\n"))
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            r#"transport = "tcp"
asap = ["127.0.0.1:0"]
asap-announce = "off"
metrics = "127.0.0.1:0"
enrp = ["127.0.0.1:0"]
enrp-announce = "off"
{peers}peer-heartbeat-cycle = "300ms"
peer-max-time-last-heard = "2s"
peer-max-time-no-response = "2s"
mentor-discovery-timeout = "500ms"

[tls]
cert = "{}"
key = "{}"
ca = "{}"
enrp-peers = ["dns:registrar-*.test"]
"#,
            path(&cert),
            path(&key),
            path(&pki.ca)
        ),
    )
    .unwrap();
    let process = Proc::start(
        &["registrar", "--config", path(&config), "--log", "warn"],
        None,
    );
    let enrp = word_after(&process.wait_for("serving ENRP on "), "serving ENRP on ");
    let metrics = endpoint_of(&process);
    let r = Registrar {
        _process: process,
        asap: "127.0.0.1:0".parse().unwrap(),
        metrics: metrics.parse().unwrap(),
    };
    (r, enrp.parse().unwrap())
}

#[test]
fn only_registrars_with_an_allowed_certificate_join_over_enrp() {
    let pki = Pki::new("ca");
    let (a, a_enrp) = enrp_registrar(&pki, "a", &["registrar-a.test"], None);
    // An allowed peer joins: each side counts the other.
    let (b, _) = enrp_registrar(&pki, "b", &["registrar-b.test"], Some(a_enrp));
    a.wait_metric("rserpool_registrar_enrp_peers", 1);
    b.wait_metric("rserpool_registrar_enrp_peers", 1);
    // A registrar whose certificate (same CA) names another host is refused, counted, and
    // never becomes a peer.
    let (_c, _) = enrp_registrar(&pki, "c", &["intruder.test"], Some(a_enrp));
    a.wait_metric(
        "rserpool_registrar_access_refused_total{reason=\"enrp_peer_not_allowed\"}",
        1,
    );
    std::thread::sleep(Duration::from_secs(1));
    let peers = a.metrics().lines().find_map(|l| {
        l.strip_prefix("rserpool_registrar_enrp_peers ")
            .map(str::to_owned)
    });
    assert_eq!(peers.as_deref(), Some("1"), "only b is a peer of a");
}

#[test]
fn rserpool_pe_and_pu_take_the_same_tls_options() {
    let pki = Pki::new("ca");
    let (rc, rk) = pki.issue("registrar", server_names());
    let config = pki.dir.path().join("registrar.toml");
    std::fs::write(
        &config,
        format!(
            r#"transport = "tcp"
asap = ["127.0.0.1:0"]
asap-announce = "off"
metrics = "127.0.0.1:0"

[tls]
cert = "{}"
key = "{}"
ca = "{}"
unauthenticated-resolve = false

[[tls.register]]
identity = "dns:*.echo.test"
pools = ["EchoPool"]
"#,
            path(&rc),
            path(&rk),
            path(&pki.ca)
        ),
    )
    .unwrap();
    let registrar = Registrar::start(&config);
    let target = registrar.asap.to_string();
    let (pc, pk) = pki.issue(
        "pe",
        Names {
            cn: "pe-1",
            dns: &["e1.echo.test"],
            ..Names::default()
        },
    );
    let (uc, uk) = pki.issue(
        "pu",
        Names {
            cn: "pu-1",
            dns: &["u1.users.test"],
            ..Names::default()
        },
    );
    let tls = |cert: &Path, key: &Path| {
        vec![
            "--tls-ca".to_string(),
            path(&pki.ca).to_string(),
            "--tls-cert".to_string(),
            path(cert).to_string(),
            "--tls-key".to_string(),
            path(key).to_string(),
            "--tls-server-name".to_string(),
            "registrar.test".to_string(),
        ]
    };
    let mut pe = bin()
        .args([
            "pe",
            "--service",
            "echo",
            "--registrar",
            &target,
            "--transport",
            "tcp",
            "--local",
            "127.0.0.1:0",
        ])
        .args(tls(&pc, &pk))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the PE starts");
    registrar.wait_metric("rserpool_registrar_pool_elements", 1);
    let mut pu = bin()
        .args(["pu", "--registrar", &target, "--transport", "tcp"])
        .args(tls(&uc, &uk))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the PU starts");
    pu.stdin
        .take()
        .unwrap()
        .write_all(b"through TLS to the registrar\n")
        .unwrap();
    let out = pu.wait_with_output().unwrap();
    let _ = pe.kill();
    let _ = pe.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("through TLS to the registrar"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    registrar.wait_metric("rserpool_registrar_tls_handshakes_total", 2);
}

/// `rserpool dump` takes the same TLS options: with a certificate the registrar's ENRP peer
/// rules allow it reads the table; with one they refuse it fails and says why it may have.
#[test]
fn rserpool_dump_over_tls_needs_a_certificate_allowed_to_peer() {
    let pki = Pki::new("ca");
    let (a, a_enrp) = enrp_registrar(&pki, "a", &["registrar-a.test"], None);
    let names = |cn: &'static str, dns: &'static [&'static str]| Names {
        cn,
        dns,
        uris: &[],
        ips: &[],
    };
    let (cert, key) = pki.issue("dump", names("dump", &["registrar-dump.test"]));
    let tls = |cert: &Path, key: &Path| {
        run(&[
            "dump",
            "--transport",
            "tcp",
            "--tls-cert",
            path(cert),
            "--tls-key",
            path(key),
            "--tls-ca",
            path(&pki.ca),
            "--timeout",
            "20s",
            &a_enrp.to_string(),
        ])
    };
    let (ok, out, err) = tls(&cert, &key);
    assert!(ok, "{err}");
    assert!(out.starts_with("Registrar $"), "{out}");
    assert!(out.contains("Total: 0 pool(s), 0 PE(s)"), "{out}");
    let (cert, key) = pki.issue("intruder", names("intruder", &["intruder.test"]));
    let (ok, _, err) = tls(&cert, &key);
    assert!(!ok);
    assert!(err.contains("ended the association"), "{err}");
    assert!(err.contains("--tls-enrp-peer"), "{err}");
    a.wait_metric(
        "rserpool_registrar_access_refused_total{reason=\"enrp_peer_not_allowed\"}",
        1,
    );
}
