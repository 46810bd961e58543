//! Every daemon serves the same HTTP endpoint (`--metrics ADDR`): `/metrics` in the OpenMetrics
//! text format with one naming scheme (`rserpool_<component>_…`), `/status` (JSON naming the
//! component), `/healthz`, 404 elsewhere; a bad `--metrics` address is named in the error. Real
//! processes over the TCP mapping on 127.0.0.1 with ephemeral ports.

mod common;

use common::process::{start_pe, word_after, Proc};
use common::{start, wait_for};
use std::io::{Read, Write};
use std::time::Duration;

/// One GET: status code, head (lower case), body.
fn get(addr: &str, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("the endpoint accepts");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("the whole answer");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// Checks the three paths and a 404 of the endpoint at `addr`; the parsed exposition and the
/// status document.
fn check_endpoint(addr: &str, component: &str) -> (prometheus_parse::Scrape, serde_json::Value) {
    let (code, head, body) = get(addr, "/metrics");
    assert_eq!(code, 200, "{component}: {head}");
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{component}: {head}"
    );
    assert!(body.ends_with("# EOF\n"), "{component}: {body}");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("{component}: the exposition does not parse: {e}\n{body}"));
    assert!(!scrape.samples.is_empty(), "{component}: {body}");
    let prefix = format!("rserpool_{component}_");
    for s in &scrape.samples {
        assert!(
            s.metric.starts_with(&prefix),
            "{component}: {} is not named {prefix}…",
            s.metric
        );
    }
    // Every sample line is `name[{labels}] integer`: nothing hand-formatted slipped through.
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<i64>().is_ok(), "{component}: {line}");
    }

    let (code, head, body) = get(addr, "/status");
    assert_eq!(code, 200, "{component}: {head}");
    assert!(
        head.contains("content-type: application/json"),
        "{component}: {head}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{component}: {e}: {body}"));
    assert_eq!(doc["component"], component, "{doc}");

    let (code, head, body) = get(addr, "/healthz");
    assert_eq!(code, 200, "{component}: {head}");
    assert!(
        head.contains("content-type: text/plain"),
        "{component}: {head}"
    );
    assert_eq!(body, "ok\n");

    let (code, _, _) = get(addr, "/no/such/path");
    assert_eq!(code, 404, "{component}");
    (scrape, doc)
}

fn value(s: &prometheus_parse::Scrape, name: &str) -> Option<f64> {
    s.samples
        .iter()
        .find(|x| x.metric == name)
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

#[test]
fn every_daemon_serves_metrics_status_and_healthz() {
    let registrar = start(0x7001, None);
    let asap = registrar.asap.to_string();
    let (pe, pe_id) = start_pe(&asap, &["--service", "pingpong"]);
    let pe_addr = word_after(&pe.wait_for("metrics at http://"), "metrics at http://")
        .trim_end_matches("/metrics")
        .to_string();
    let pu = Proc::start(
        &[
            "pu",
            "--registrar",
            &asap,
            "--transport",
            "tcp",
            "--service",
            "pingpong",
            "--interval",
            "100ms",
            "--quiet",
            "true",
            "--metrics",
            "127.0.0.1:0",
        ],
        None,
    );
    let pu_addr = word_after(&pu.wait_for("metrics at http://"), "metrics at http://")
        .trim_end_matches("/metrics")
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lsnat.toml");
    std::fs::write(
        &config,
        "metrics = \"127.0.0.1:0\"\n[[listener]]\naddress = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [pool]\npolicy = \"round-robin\"\nmembers = [ { address = \"127.0.0.1:9\", weight = 1 } ]\n",
    )
    .unwrap();
    let gateway = Proc::start(&["lsnat", "-c", config.to_str().unwrap()], None);
    let gw_addr = word_after(
        &gateway.wait_for("metrics at http://"),
        "metrics at http://",
    )
    .trim_end_matches("/metrics")
    .to_string();

    // The PU answers once its session has run a little: Pongs came back.
    wait_for("the PU's Pongs", Duration::from_secs(60), || {
        let (_, _, body) = get(&pu_addr, "/status");
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|d| d["counters"]["messages_received"].as_u64())
            .is_some_and(|n| n >= 2)
    });

    let reg_addr = registrar.metrics.to_string();
    let (m, doc) = check_endpoint(&reg_addr, "registrar");
    assert_eq!(value(&m, "rserpool_registrar_pool_elements"), Some(1.0));
    assert_eq!(doc["registrar_id"], "$00007001");
    assert_eq!(doc["pool_element_count"], 1);
    assert_eq!(doc["pools"][0]["handle"], "PingPongPool", "{doc}");
    assert_eq!(doc["pools"][0]["pool_elements"], 1, "{doc}");
    assert!(
        doc["counters"]["handle_resolutions"].as_u64().unwrap() >= 1,
        "{doc}"
    );

    let (m, doc) = check_endpoint(&pe_addr, "pe");
    assert_eq!(value(&m, "rserpool_pe_registered"), Some(1.0));
    assert_eq!(doc["id"], pe_id.as_str(), "{doc}");
    assert_eq!(doc["registered"], true, "{doc}");
    // The home registrar is known once it has sent a keep-alive (it names itself there).
    assert!(doc["home"].is_null() || doc["home"] == "$00007001", "{doc}");

    let (m, doc) = check_endpoint(&pu_addr, "pu");
    assert!(value(&m, "rserpool_pu_reached_total").unwrap() >= 1.0);
    assert_eq!(value(&m, "rserpool_pu_session_open"), Some(1.0));
    assert_eq!(doc["pool"], "PingPongPool", "{doc}");
    assert_eq!(doc["pe"], pe_id.as_str(), "{doc}");
    assert_eq!(doc["session"], "open", "{doc}");

    let (m, doc) = check_endpoint(&gw_addr, "lsnat");
    assert_eq!(value(&m, "rserpool_lsnat_sessions_active"), Some(0.0));
    assert_eq!(doc["members"][0]["address"], "127.0.0.1:9", "{doc}");

    // The monitor reads all four and shows the PU beside the pool's PE.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rserpool"))
        .args([
            "monitor", "--once", "--csp", "off", "--status", &reg_addr, "--status", &pe_addr,
            "--status", &pu_addr, "--status", &gw_addr,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool_line = text
        .lines()
        .find(|l| l.contains("PingPongPool") && l.contains(&format!("http://{reg_addr}")))
        .unwrap_or_else(|| panic!("the registrar's pool in the Pools pane:\n{text}"));
    assert!(
        pool_line.contains(&format!("http://{pu_addr}")),
        "{pool_line}\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("PU") && l.contains(&pe_id) && l.contains("open")),
        "the PU's session:\n{text}"
    );
    drop((pe, pu, gateway));
}

/// `--metrics` with an address that cannot be bound: every daemon stops with an error naming
/// the option and the address.
#[test]
fn a_bad_metrics_address_is_named() {
    let registrar = start(0x7002, None);
    let asap = registrar.asap.to_string();
    // TEST-NET-1: on no interface of this host.
    let bad = "192.0.2.1:9100";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lsnat.toml");
    std::fs::write(
        &config,
        format!(
            "metrics = \"{bad}\"\n[[listener]]\naddress = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
             [pool]\npolicy = \"round-robin\"\nmembers = [ {{ address = \"127.0.0.1:9\", weight = 1 }} ]\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    for args in [
        vec![
            "registrar",
            "--transport",
            "tcp",
            "--asap",
            "127.0.0.1:0",
            "--asap-announce",
            "off",
            "--metrics",
            bad,
        ],
        vec![
            "pe",
            "--registrar",
            &asap,
            "--transport",
            "tcp",
            "--local",
            "127.0.0.1:0",
            "--metrics",
            bad,
        ],
        vec![
            "pu",
            "--registrar",
            &asap,
            "--transport",
            "tcp",
            "--service",
            "pingpong",
            "--metrics",
            bad,
        ],
        vec!["lsnat", "-c", &config],
    ] {
        let mut p = Proc::start(&args, None);
        assert!(!p.wait_exit(), "{args:?} must fail");
        let err = p.err();
        let last = err.lines().last().unwrap_or_default();
        assert!(last.contains(bad), "{args:?}: {err}");
        assert!(last.contains("metrics"), "{args:?}: {err}");
    }
}
