//! ENRP between real `rserpool registrar` processes over the TCP mapping on 127.0.0.1: three
//! registrars share one handlespace; after `kill -9` of a PE's home registrar exactly one
//! survivor takes the PE over and the PE receives its H=1 keep-alive. The PE is a minimal one
//! made of raw wire messages (tests/common), listening on its ASAP port as an SCTP PE would.

mod common;

use common::*;
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{Codec, PoolHandle, RegistrarId};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A handle resolution at `r` over the TCP mapping: the PE IDs it returns.
fn resolve(r: &Registrar) -> Vec<u32> {
    resolve_n(r, None)
}

fn resolve_n(r: &Registrar, items: Option<u32>) -> Vec<u32> {
    let codec = Codec::default();
    let Ok(mut s) = TcpStream::connect(r.asap) else {
        return Vec::new();
    };
    let m = AsapMessage::HandleResolution(asap::HandleResolution {
        pool_handle: PoolHandle::from("EnrpPool"),
        subscribe: false,
        option: items.map(|items| rserpool_wire::HandleResolutionOption { items }),
    });
    s.write_all(&frame(11, &codec.encode(&m).unwrap())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = [0u8; 12];
    if s.read_exact(&mut h).is_err() {
        return Vec::new();
    }
    let mut p = vec![0u8; u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize];
    s.read_exact(&mut p).unwrap();
    match codec.decode::<AsapMessage>(&p).unwrap().message {
        AsapMessage::HandleResolutionResponse(r) => {
            r.pool_elements.iter().map(|e| e.id.0).collect()
        }
        _ => Vec::new(),
    }
}

#[test]
fn three_registrars_share_a_pe_and_one_takes_it_over_after_kill_9() {
    let r1 = start(0x1001, None);
    let r2 = start(0x1002, Some(r1.enrp));
    let r3 = start(0x1003, Some(r1.enrp));
    let all = [&r1, &r2, &r3];
    wait_for("three peers each", Duration::from_secs(60), || {
        all.iter()
            .all(|r| metric(r, "rserpool_registrar_enrp_peers") == 2)
    });
    let homes = pe(&r1, 0x77);
    wait_for("the PE at every registrar", Duration::from_secs(60), || {
        all.iter()
            .all(|r| metric(r, "rserpool_registrar_pool_elements") == 1)
    });
    for r in all {
        assert_eq!(resolve(r), vec![0x77], "every registrar resolves the PE");
    }
    let killed = Instant::now();
    let mut r1 = r1;
    r1.child.kill().unwrap();
    let _ = r1.child.wait();
    wait_for("the H=1 keep-alive", Duration::from_secs(60), || {
        !homes.lock().unwrap().is_empty()
    });
    let (new_home, at) = homes.lock().unwrap()[0];
    eprintln!(
        "kill -9 to H=1 keep-alive at the PE: {:.3} s (new home {new_home})",
        (at - killed).as_secs_f64()
    );
    let survivors = [&r2, &r3];
    wait_for("one takeover won", Duration::from_secs(30), || {
        survivors
            .iter()
            .map(|r| {
                metric(
                    r,
                    "rserpool_registrar_enrp_takeovers_total{outcome=\"won\"}",
                )
            })
            .sum::<u64>()
            == 1
    });
    // Exactly one: the other never wins later.
    std::thread::sleep(Duration::from_secs(3));
    let won: Vec<u64> = survivors
        .iter()
        .map(|r| {
            metric(
                r,
                "rserpool_registrar_enrp_takeovers_total{outcome=\"won\"}",
            )
        })
        .collect();
    assert_eq!(won.iter().sum::<u64>(), 1, "{won:?}");
    assert!(homes.lock().unwrap().iter().all(|(id, _)| *id == new_home));
    let winner = if won[0] == 1 { &r2 } else { &r3 };
    assert!([RegistrarId(0x1002), RegistrarId(0x1003)].contains(&new_home));
    wait_for(
        "the winner's keep-alive answered",
        Duration::from_secs(30),
        || metric(winner, "rserpool_registrar_keep_alives_acked_total") >= 1,
    );
    for r in survivors {
        assert_eq!(resolve(r), vec![0x77], "the PE stays resolvable");
        assert!(metrics(r).contains(&format!("home=\"{new_home}\"")));
    }
}

/// The PEs per home registrar with their checksums, as a registrar's metrics list them.
fn by_home(r: &Registrar) -> Vec<String> {
    let mut v: Vec<String> = metrics(r)
        .lines()
        .filter(|l| l.starts_with("rserpool_registrar_enrp_pool_elements_by_home{"))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn hundred_pes_converge_and_a_restarted_registrar_resynchronises() {
    let r1 = start(0x2001, None);
    let r2 = start(0x2002, Some(r1.enrp));
    let r3 = start(0x2003, Some(r1.enrp));
    std::env::set_var(
        "ENRP_TEST_METRICS",
        format!("{},{},{}", r1.metrics, r2.metrics, r3.metrics),
    );
    wait_for("three peers each", Duration::from_secs(60), || {
        [&r1, &r2, &r3]
            .iter()
            .all(|r| metric(r, "rserpool_registrar_enrp_peers") == 2)
    });
    // 100 PEs across the three, 10 associations of 3 or 4 PEs each per registrar.
    let mut _pes = Vec::new();
    for (i, r) in [&r1, &r2, &r3].into_iter().enumerate() {
        let ids: Vec<u32> = (1..=100u32).filter(|id| (*id as usize) % 3 == i).collect();
        for chunk in ids.chunks(4) {
            _pes.push(pes(r, chunk));
        }
    }
    let all = [&r1, &r2, &r3];
    wait_for(
        "100 PEs at every registrar",
        Duration::from_secs(60),
        || {
            all.iter()
                .all(|r| metric(r, "rserpool_registrar_pool_elements") == 100)
        },
    );
    wait_for(
        "equal checksums everywhere",
        Duration::from_secs(30),
        || {
            let h = by_home(&r1);
            h.len() == 3 && by_home(&r2) == h && by_home(&r3) == h
        },
    );
    for r in all {
        let mut ids = resolve_n(r, Some(0xffff_ffff));
        ids.sort();
        assert_eq!(
            ids,
            (1..=100).collect::<Vec<_>>(),
            "every registrar resolves every PE"
        );
    }
    // kill -9 r3: its PEs move to one survivor, and follow it (they answer the H=1 keep-alive).
    let mut r3 = r3;
    r3.child.kill().unwrap();
    let _ = r3.child.wait();
    wait_for("the takeover of r3", Duration::from_secs(60), || {
        [&r1, &r2]
            .iter()
            .map(|r| {
                metric(
                    r,
                    "rserpool_registrar_enrp_takeovers_total{outcome=\"won\"}",
                )
            })
            .sum::<u64>()
            == 1
    });
    wait_for("every PE adopted", Duration::from_secs(30), || {
        [&r1, &r2]
            .iter()
            .map(|r| metric(r, "rserpool_registrar_pool_elements_adopted_total"))
            .sum::<u64>()
            == 33
    });
    // The killed registrar comes back (same ID) and takes the table from its mentor.
    let r3 = start_with(0x2003, Some(r1.enrp), &[]);
    wait_for(
        "the restarted registrar to hold every PE",
        Duration::from_secs(60),
        || metric(&r3, "rserpool_registrar_pool_elements") == 100,
    );
    wait_for(
        "equal checksums after the restart",
        Duration::from_secs(30),
        || {
            let h = by_home(&r1);
            h.len() == 2 && by_home(&r2) == h && by_home(&r3) == h
        },
    );
    let mut ids = resolve_n(&r3, Some(0xffff_ffff));
    ids.sort();
    assert_eq!(ids, (1..=100).collect::<Vec<_>>());
}

fn rss_kib(r: &Registrar) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", r.child.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn sent_total(r: &Registrar) -> BTreeMap<String, u64> {
    metrics(r)
        .lines()
        .filter(|l| l.starts_with("rserpool_registrar_enrp_messages_sent_total{"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((between(k, "type=\"", "\"").to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Figures for docs and the closing note, not a timed test: the time a new registrar takes to
/// download N PEs from its mentor over the TCP mapping, the memory the learned PEs take, and the
/// ENRP traffic at rest with three registrars. `ENRP_FIGURE_PES` (default 10 000).
#[test]
#[ignore = "benchmark: cargo test -p rserpool-cli --release --test enrp figures -- --ignored --nocapture"]
fn figures_sync_memory_and_traffic_at_rest() {
    let n: u32 = std::env::var("ENRP_FIGURE_PES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let quiet = [
        "--endpoint-keep-alive-transmission-interval",
        "3600000",
        "--default-timers",
    ];
    let r1 = start_with(0x3001, None, &quiet);
    let ids: Vec<u32> = (1..=n).collect();
    let mut _pes = Vec::new();
    for chunk in ids.chunks(1000) {
        _pes.push(pes(&r1, chunk));
    }
    wait_for("the PEs at the mentor", Duration::from_secs(600), || {
        metric(&r1, "rserpool_registrar_pool_elements") == u64::from(n)
    });
    let t = Instant::now();
    let r2 = start_with(0x3002, Some(r1.enrp), &quiet);
    let rss_before = rss_kib(&r2);
    wait_for(
        "the new registrar up to date",
        Duration::from_secs(600),
        || metric(&r2, "rserpool_registrar_pool_elements") == u64::from(n),
    );
    let took = t.elapsed();
    let rss_after = rss_kib(&r2);
    eprintln!(
        "FIGURE sync: {n} PEs from the mentor in {:.3} s ({:.0} PEs/s), {} handle table responses",
        took.as_secs_f64(),
        f64::from(n) / took.as_secs_f64(),
        sent_total(&r1)
            .get("ENRP_HANDLE_TABLE_RESPONSE")
            .copied()
            .unwrap_or(0)
    );
    eprintln!(
        "FIGURE memory: RSS {} KiB -> {} KiB: {:.0} bytes per learned PE",
        rss_before,
        rss_after,
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / f64::from(n)
    );
    let r3 = start_with(0x3003, Some(r1.enrp), &quiet);
    wait_for(
        "the third registrar up to date",
        Duration::from_secs(600),
        || metric(&r3, "rserpool_registrar_pool_elements") == u64::from(n),
    );
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<_> = [&r1, &r2, &r3].iter().map(|r| sent_total(r)).collect();
    let window = Duration::from_secs(20);
    std::thread::sleep(window);
    for (i, r) in [&r1, &r2, &r3].into_iter().enumerate() {
        let after = sent_total(r);
        let rate: Vec<String> = after
            .iter()
            .map(|(k, v)| (k, v - before[i].get(k).copied().unwrap_or(0)))
            .filter(|(_, d)| *d > 0)
            .map(|(k, d)| format!("{k} {:.2}/s", d as f64 / window.as_secs_f64()))
            .collect();
        eprintln!("FIGURE at rest, registrar {}: {}", i + 1, rate.join(", "));
    }
    // kill -9 of the home of every PE, with RSPLIB's default timers: the time to the last PE
    // adopted by its new home.
    let t = Instant::now();
    let mut r1 = r1;
    r1.child.kill().unwrap();
    let _ = r1.child.wait();
    let adopted = || {
        [&r2, &r3]
            .iter()
            .map(|r| metric(r, "rserpool_registrar_pool_elements_adopted_total"))
            .sum::<u64>()
    };
    wait_for("every PE adopted", Duration::from_secs(600), || {
        adopted() == u64::from(n)
    });
    eprintln!(
        "FIGURE takeover: kill -9 of the home of {n} PEs to the last PE adopted: {:.3} s (default rsplib timers)",
        t.elapsed().as_secs_f64()
    );
}

/// `rserpool pe` over the TCP mapping follows its new home: after `kill -9` of the registrar it
/// registered with, the peer that takes it over reaches it with the H=1 keep-alive (at the
/// address the PE's connection came from) and the PE adopts it.
#[test]
fn our_pe_process_follows_its_new_home_after_kill_9() {
    let r1 = start(0x2001, None);
    let r2 = start(0x2002, Some(r1.enrp));
    wait_for("two peers", Duration::from_secs(60), || {
        metric(&r1, "rserpool_registrar_enrp_peers") == 1
            && metric(&r2, "rserpool_registrar_enrp_peers") == 1
    });
    let mut pe = Command::new(env!("CARGO_BIN_EXE_rserpool"))
        .args([
            "pe",
            "--service",
            "echo",
            "--registrar",
            &r1.asap.to_string(),
            "--transport",
            "tcp",
            "--local",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the PE starts");
    wait_for("the PE at both registrars", Duration::from_secs(60), || {
        metric(&r1, "rserpool_registrar_pool_elements") == 1
            && metric(&r2, "rserpool_registrar_pool_elements") == 1
    });
    let mut r1 = r1;
    r1.child.kill().unwrap();
    let _ = r1.child.wait();
    let adopted = std::panic::catch_unwind(|| {
        wait_for("the PE adopting r2", Duration::from_secs(60), || {
            metric(&r2, "rserpool_registrar_pool_elements_adopted_total") >= 1
        })
    });
    let registered = metric(&r2, "rserpool_registrar_pool_elements");
    let _ = pe.kill();
    let _ = pe.wait();
    assert!(adopted.is_ok(), "the PE did not adopt its new home");
    assert_eq!(registered, 1, "the PE stays registered at its new home");
}

/// A network namespace joined to this one by a veth pair: `host` here, `inside` there.
struct Netns {
    name: String,
    link: String,
    host: &'static str,
    inside: &'static str,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let pid = std::process::id();
        let ns = Netns {
            name: format!("rsp-enrp-{pid}"),
            link: format!("rspe{}", pid % 100_000),
            host: "10.213.0.1",
            inside: "10.213.0.2",
        };
        let peer = format!("{}n", ns.link);
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link", "add", &ns.link, "type", "veth", "peer", "name", &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &ns.name])?;
        ip(&["addr", "add", "10.213.0.1/30", "dev", &ns.link])?;
        ip(&["link", "set", &ns.link, "up"])?;
        for args in [
            vec!["addr", "add", "10.213.0.2/30", "dev", &peer],
            vec!["link", "set", &peer, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut a = vec!["-n", &ns.name];
            a.extend(args);
            ip(&a)?;
        }
        Ok(ns)
    }

    /// Runs `nft -f -` with `rules` inside the namespace.
    fn nft(&self, rules: &str) {
        let mut c = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft runs");
        c.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
        assert!(c.wait().unwrap().success(), "nft -f - failed on:\n{rules}");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.link]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Who holds which PE, by the handle resolution of every registrar.
fn resolved(r: &Registrar) -> Vec<u32> {
    let mut ids = resolve_n(r, Some(0xffff_ffff));
    ids.sort();
    ids
}

/// A partition, with real processes: registrar C runs in its own network namespace and is cut
/// off from A and B (their ENRP traffic dropped both ways, ASAP still flowing) for longer than
/// the TCP mapping's keep-alive timeout, so that the associations between them fail and the
/// HANDLE_UPDATEs sent meanwhile are lost. PEs register on both sides during the cut. After the
/// cut heals, the checksums in the PRESENCEs differ and the audit (RFC 5353 §3.6)
/// resynchronises both sides: every registrar ends with the same handlespace. The peer timers
/// are longer than the cut, so that nobody is declared dead and nothing is taken over.
///
/// Needs root, `ip netns` and `nft` (CI has them); elsewhere it says so and returns, unless
/// `ENRP_NETNS_REQUIRED=1` makes that a failure.
#[test]
fn a_partition_heals_through_the_audit() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(e) if std::env::var("ENRP_NETNS_REQUIRED").as_deref() == Ok("1") => {
            panic!("network namespaces needed (ENRP_NETNS_REQUIRED=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped: this test needs root, ip netns and nft ({e})");
            return;
        }
    };
    let timers = [
        "--default-timers",
        "--mentor-discovery-timeout",
        "1s",
        "--takeover-expiry-interval",
        "10s",
        "--peer-heartbeat-cycle",
        "1s",
        "--peer-max-time-last-heard",
        "60s",
        "--peer-max-time-no-response",
        "30s",
    ];
    let a = start_at(ns.host, None, 0x4001, None, &timers);
    let b = start_at(ns.host, None, 0x4002, Some(a.enrp), &timers);
    let c = start_at(ns.inside, Some(&ns.name), 0x4003, Some(a.enrp), &timers);
    let all = [&a, &b, &c];
    wait_for("three peers each", Duration::from_secs(60), || {
        all.iter()
            .all(|r| metric(r, "rserpool_registrar_enrp_peers") == 2)
    });
    let mut _pes = Vec::new();
    for (i, r) in all.iter().enumerate() {
        let first = 1 + 9 * i as u32;
        for chunk in (first..first + 9).collect::<Vec<_>>().chunks(3) {
            _pes.push(pes_from(ns.host, r, chunk));
        }
    }
    let before: Vec<u32> = (1..=27).collect();
    wait_for("27 PEs at every registrar", Duration::from_secs(60), || {
        all.iter().all(|r| resolved(r) == before)
    });

    // Cut C off: ENRP to and from A's, B's and C's ENRP ports is dropped in C's namespace.
    let cut = format!(
        "table inet rsp_partition {{
            chain input {{ type filter hook input priority 0; tcp sport {{ {a}, {b} }} drop; tcp dport {c} drop; }}
            chain output {{ type filter hook output priority 0; tcp dport {{ {a}, {b} }} drop; tcp sport {c} drop; }}
        }}",
        a = a.enrp.port(),
        b = b.enrp.port(),
        c = c.enrp.port()
    );
    ns.nft(&cut);
    let cut_at = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    // New PEs on both sides of the cut.
    _pes.push(pes_from(ns.host, &a, &[101, 102, 103]));
    _pes.push(pes_from(ns.host, &c, &[301, 302, 303]));
    wait_for(
        "the new PEs at their homes",
        Duration::from_secs(30),
        || resolved(&a).contains(&103) && resolved(&c).contains(&303),
    );
    let audits = |r: &Registrar| metric(r, "rserpool_registrar_enrp_audit_mismatches_total");
    let audits_before: Vec<u64> = all.iter().map(|r| audits(r)).collect();
    // Hold the cut well past the mapping's keep-alive timeout (5 s) and connect timeout (5 s):
    // every association that carried the updates is gone by then.
    while cut_at.elapsed() < Duration::from_secs(16) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let (at_a, at_c) = (resolved(&a), resolved(&c));
    assert!(
        !at_c.contains(&101) && !at_a.contains(&301),
        "the cut kept the updates apart: A resolves {at_a:?}, C resolves {at_c:?}"
    );
    assert_eq!(
        metric(&a, "rserpool_registrar_enrp_peers"),
        2,
        "nobody was declared dead during the cut"
    );

    ns.nft("delete table inet rsp_partition");
    let mut after = before.clone();
    after.extend([101, 102, 103, 301, 302, 303]);
    after.sort();
    wait_for(
        "the same 33 PEs at every registrar after the heal",
        Duration::from_secs(90),
        || all.iter().all(|r| resolved(r) == after),
    );
    wait_for(
        "equal checksums after the heal",
        Duration::from_secs(60),
        || {
            let h = by_home(&a);
            h.len() == 3 && by_home(&b) == h && by_home(&c) == h
        },
    );
    let audits_after: Vec<u64> = all.iter().map(|r| audits(r)).collect();
    assert!(
        audits_after[2] > audits_before[2],
        "C resynchronised through the audit: {audits_before:?} -> {audits_after:?}"
    );
    assert!(
        audits_after[0] + audits_after[1] > audits_before[0] + audits_before[1],
        "A or B resynchronised through the audit: {audits_before:?} -> {audits_after:?}"
    );
    for r in all {
        assert_eq!(
            metric(
                r,
                "rserpool_registrar_enrp_takeovers_total{outcome=\"won\"}"
            ),
            0,
            "nothing was taken over"
        );
    }
}
