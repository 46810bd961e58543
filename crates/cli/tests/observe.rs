//! Every daemon serves the same HTTP endpoint (`--metrics ADDR`): `/metrics` in the OpenMetrics
//! text format with one naming scheme (`rserpool_<component>_…`), `/status` (JSON naming the
//! component), `/healthz`, 404 elsewhere; a bad `--metrics` address is named in the error. Real
//! processes over the TCP mapping on 127.0.0.1 with ephemeral ports.

mod common;

use common::process::{endpoint_of, run, start_gateway, start_pe, start_pu, Proc};
use common::{start, wait_for};
use rserpool_testkit::http;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::time::Duration;

/// One GET: status code, head (lower case), body.
fn get(addr: &str, path: &str) -> (u16, String, String) {
    let answer = http::get_blocking(addr, path).expect("the whole answer");
    (answer.code, answer.head, answer.body)
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

/// A registrar (with an ENRP peer), a PingPong PE, a PU and a gateway, each with its endpoint.
struct All {
    registrar: common::Registrar,
    _peer: common::Registrar,
    _pe: Proc,
    pe_id: String,
    pe_addr: String,
    _pu: Proc,
    pu_addr: String,
    _gateway: Proc,
    gw_addr: String,
    _dir: tempfile::TempDir,
}

fn start_all(id: u32) -> All {
    let registrar = start(id, None);
    let peer = start(id + 1, Some(registrar.enrp));
    let asap = registrar.asap.to_string();
    let (pe, pe_id) = start_pe(&asap, &["--service", "pingpong"]);
    let pe_addr = endpoint_of(&pe);
    let (pu, pu_addr) = start_pu(&asap, &["--interval", "100ms"]);
    let (gateway, gw_addr, dir) = start_gateway();
    // The registrars are peers before anything is read.
    let m = registrar.metrics.to_string();
    wait_for("the ENRP peer", Duration::from_secs(60), || {
        let (_, _, body) = get(&m, "/metrics");
        body.contains("rserpool_registrar_enrp_peers 1\n")
    });
    All {
        registrar,
        _peer: peer,
        _pe: pe,
        pe_id,
        pe_addr,
        _pu: pu,
        pu_addr,
        _gateway: gateway,
        gw_addr,
        _dir: dir,
    }
}

#[test]
fn every_daemon_serves_metrics_status_and_healthz() {
    let all = start_all(0x7001);
    let All {
        registrar,
        pe_id,
        pe_addr,
        pu_addr,
        gw_addr,
        ..
    } = &all;
    let pe_id = pe_id.clone();
    // The PU answers once its session has run a little: Pongs came back.
    wait_for("the PU's Pongs", Duration::from_secs(60), || {
        let (_, _, body) = get(pu_addr, "/status");
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
    assert_eq!(doc["peers"][0]["id"], "$00007002", "{doc}");
    assert_eq!(doc["pools"][0]["handle"], "PingPongPool", "{doc}");
    assert_eq!(doc["pools"][0]["pool_elements"], 1, "{doc}");
    assert!(
        doc["counters"]["handle_resolutions"].as_u64().unwrap() >= 1,
        "{doc}"
    );

    let (m, doc) = check_endpoint(pe_addr, "pe");
    assert_eq!(value(&m, "rserpool_pe_registered"), Some(1.0));
    assert_eq!(doc["id"], pe_id.as_str(), "{doc}");
    assert_eq!(doc["registered"], true, "{doc}");
    // The home registrar is known once it has sent a keep-alive (it names itself there).
    assert!(doc["home"].is_null() || doc["home"] == "$00007001", "{doc}");

    let (m, doc) = check_endpoint(pu_addr, "pu");
    assert!(value(&m, "rserpool_pu_reached_total").unwrap() >= 1.0);
    assert_eq!(value(&m, "rserpool_pu_session_open"), Some(1.0));
    assert_eq!(doc["pool"], "PingPongPool", "{doc}");
    assert_eq!(doc["pe"], pe_id.as_str(), "{doc}");
    assert_eq!(doc["session"], "open", "{doc}");

    let (m, doc) = check_endpoint(gw_addr, "lsnat");
    assert_eq!(value(&m, "rserpool_lsnat_sessions_active"), Some(0.0));
    assert_eq!(doc["members"][0]["address"], "127.0.0.1:9", "{doc}");

    // The monitor reads all four and shows the PU beside the pool's PE.
    let (ok, text, err) = run(&[
        "monitor", "--once", "--csp", "off", "--status", &reg_addr, "--status", pe_addr,
        "--status", pu_addr, "--status", gw_addr,
    ]);
    assert!(ok, "{text}\n{err}");
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
    drop(all);
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

/// Metric families of OpenMetrics text: sample name (counters with `_total`) → type, help and
/// the label names their samples carry.
fn families(text: &str) -> BTreeMap<String, (String, String, BTreeSet<String>)> {
    let mut help = BTreeMap::new();
    let mut out: BTreeMap<String, (String, String, BTreeSet<String>)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), h.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let sample = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            out.insert(
                sample,
                (
                    kind.to_string(),
                    help.get(name).cloned().unwrap_or_default(),
                    BTreeSet::new(),
                ),
            );
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if let (Some(f), Some(rest)) =
                (out.get_mut(&line[..end]), line[end..].strip_prefix('{'))
            {
                // Label values never hold `",` unescaped, nor `"}` before the end.
                for pair in rest
                    .rsplit_once('}')
                    .map(|x| x.0)
                    .unwrap_or("")
                    .split("\",")
                {
                    if let Some((k, _)) = pair.split_once('=') {
                        f.2.insert(k.trim().to_string());
                    }
                }
            }
        }
    }
    out
}

/// docs/operations.md lists every metric family the daemons serve (and no other), with its
/// type, labels and help text: the table between the markers is generated from what a running
/// registrar (with a peer), PE, PU and gateway serve, plus the NAT data plane's counters.
/// `UPDATE_DOCS=1` rewrites it.
#[test]
fn the_operations_guide_lists_every_served_metric() {
    let all = start_all(0x7101);
    wait_for("the PU's Pongs", Duration::from_secs(60), || {
        let (_, _, body) = get(&all.pu_addr, "/metrics");
        body.contains("rserpool_pu_reached_total 1")
    });
    // The member's liveness families have samples once its probes have said something (the
    // member is a closed port: refused, then dead), so that their labels are known.
    wait_for(
        "the member's evidence and transitions",
        Duration::from_secs(60),
        || {
            let (_, _, body) = get(&all.gw_addr, "/metrics");
            body.contains("rserpool_lsnat_member_evidence_total{")
                && body.contains("rserpool_lsnat_member_transitions_total{")
        },
    );
    let mut served = BTreeMap::new();
    for addr in [
        all.registrar.metrics.to_string(),
        all.pe_addr.clone(),
        all.pu_addr.clone(),
        all.gw_addr.clone(),
    ] {
        served.extend(families(&get(&addr, "/metrics").2));
    }
    let mut nat = String::new();
    rserpool_lsnat::nat::Stats::default().render_prometheus(&mut nat);
    served.extend(families(&nat));
    let component_order = ["registrar", "pe", "pu", "lsnat"];
    let mut rows: Vec<_> = served.into_iter().collect();
    rows.sort_by_key(|(name, _)| {
        let c = name.split('_').nth(1).unwrap_or("");
        (
            component_order.iter().position(|x| *x == c).unwrap_or(9),
            name.clone(),
        )
    });
    let mut table = String::from("| metric | type | labels | meaning |\n|---|---|---|---|\n");
    for (name, (kind, help, labels)) in rows {
        let labels = if labels.is_empty() {
            "".to_string()
        } else {
            labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        table.push_str(&format!(
            "| `{name}` | {kind} | {labels} | {} |\n",
            help.replace('|', "\\|")
        ));
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let doc = std::fs::read_to_string(path).expect("docs/operations.md");
    let (begin, end) = ("<!-- metrics:begin -->\n", "<!-- metrics:end -->");
    let i = doc.find(begin).expect("the begin marker") + begin.len();
    let j = doc.find(end).expect("the end marker");
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, format!("{}{table}{}", &doc[..i], &doc[j..])).unwrap();
        return;
    }
    assert!(
        doc[i..j] == table,
        "docs/operations.md does not list the metrics served; run \
         UPDATE_DOCS=1 cargo test -p rserpool-cli --test observe the_operations_guide\n\
         served:\n{table}"
    );
    drop(all);
}

/// `--metrics-max-connections` and `--metrics-timeout` reach the endpoint: with one slot, a
/// silent client holds it and the next client is closed without an answer until the first
/// leaves. Bad values are refused naming the setting.
#[test]
fn http_limits_are_set_and_checked() {
    let r = common::start_with(
        0x7201,
        None,
        &["--metrics-max-connections", "1", "--metrics-timeout", "60s"],
    );
    let addr = r.metrics.to_string();
    assert_eq!(get(&addr, "/healthz").0, 200);
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    // The silent connection is accepted first and holds the one slot: the next is refused.
    let refused = {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text
    };
    assert!(
        refused.is_empty(),
        "answered beyond the connection limit: {refused}"
    );
    drop(silent);
    wait_for("the slot to be free again", Duration::from_secs(60), || {
        http::get_blocking(&addr, "/healthz")
            .is_ok_and(|answer| answer.status_line.starts_with("HTTP/1.1 200"))
    });

    let check = |args: &[&str]| {
        let (ok, _, err) = run(args);
        assert!(!ok, "{args:?} must be refused");
        err
    };
    let err = check(&[
        "registrar",
        "--asap",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--metrics-timeout",
        "0s",
        "--check",
    ]);
    assert!(err.contains("metrics-timeout"), "{err}");
    let err = check(&[
        "pe",
        "--registrar",
        "127.0.0.1:9",
        "--metrics",
        "127.0.0.1:0",
        "--metrics-max-connections",
        "0",
        "--check",
    ]);
    assert!(err.contains("metrics-max-connections"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lsnat.toml");
    std::fs::write(
        &config,
        "metrics = \"127.0.0.1:0\"\n[[listener]]\naddress = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [pool]\npolicy = \"round-robin\"\nmembers = [ { address = \"127.0.0.1:9\", weight = 1 } ]\n\
         [limits]\nmetrics-max-connections = 0\n",
    )
    .unwrap();
    let err = check(&["lsnat", "-c", config.to_str().unwrap(), "--check"]);
    assert!(err.contains("metrics-max-connections"), "{err}");
}
