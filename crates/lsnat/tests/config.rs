//! Configuration: defaults are the RFC floors; malformed files are refused with the field's
//! name (and line); flags work without a file.

use rserpool_lsnat::config::{parse_duration, ProbeKind};
use rserpool_lsnat::core::member::Cost;
use rserpool_lsnat::core::policy::LoadSharePolicy;
use rserpool_lsnat::core::Protocol;
use rserpool_lsnat::{Config, ConfigError, LsnatArgs, Overrides};
use std::time::Duration;

const GOOD: &str = r#"
metrics = "127.0.0.1:9090"

[[listener]]
address = "127.0.0.1:8080"
protocol = "tcp"

[[listener]]
address = "[::1]:8053"
protocol = "udp"

[pool]
policy = "weighted-least-sessions"
members = [
  { address = "127.0.0.1:9000", weight = 3, cost = 10 },
  { address = "127.0.0.1:9001", weight = 0 },
  { address = "[::1]:9002", cost = "unreachable", max-sessions = 5 },
]

[timers]
udp = "10m"
tcp-established = "2h"

[health]
interval = "500ms"
timeout = "400ms"
fall = 2
send = "ping\n"
expect = "pong"
panic-threshold = 50

[limits]
max-sessions = 100

[persistence]
timeout = "5m"
netmask-v4 = 24

"#;

/// The same file in the spelling of the first release: snake_case keys, bare numbers of seconds,
/// `[status] address`.
const OLD_SPELLING: &str = r#"
[[listener]]
address = "127.0.0.1:8080"

[pool]
traffic_window = 20
members = [{ address = "127.0.0.1:9000", max_sessions = 5 }]

[timers]
tcp_established = 7200

[health]
panic_threshold = 50

[status]
address = "127.0.0.1:9090"
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text, "test.toml", &Overrides::default())
}

fn error(text: &str) -> String {
    parse(text).expect_err("must be refused").to_string()
}

#[test]
fn a_full_file_is_read() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.listeners[1].protocol, Protocol::Udp);
    assert_eq!(c.core.policy, LoadSharePolicy::WeightedLeastSessions);
    assert_eq!(c.members[0].weight, 3);
    assert_eq!(c.members[0].cost, Cost::Finite(10));
    assert_eq!(c.members[1].weight, 0);
    assert_eq!(c.members[2].cost, Cost::Unreachable);
    assert_eq!(c.members[2].max_sessions, Some(5));
    assert_eq!(c.core.timers.udp, Duration::from_secs(600));
    assert_eq!(c.probe.interval, Duration::from_millis(500));
    assert_eq!(c.probe.kind, ProbeKind::Tcp);
    assert_eq!(c.probe.send, b"ping\n");
    assert_eq!(c.core.health.panic_threshold_percent, 50);
    assert_eq!(c.core.persistence.netmask_v4, 24);
    assert_eq!(c.core.limits.max_sessions, 100);
    assert!(c.status.is_some());
    // 2 h is below RFC 5382's 2 h 4 min: accepted, with a warning in words.
    assert_eq!(
        c.warnings,
        vec!["timers.tcp-established = \"2h\" is below the RFC 5382 REQ-5 floor of 2h 4m"]
    );
}

#[test]
fn the_old_spelling_still_works_with_a_warning_for_each_change() {
    let c = parse(OLD_SPELLING).unwrap();
    assert_eq!(c.members[0].max_sessions, Some(5));
    assert_eq!(c.core.traffic_window, Duration::from_secs(20));
    assert_eq!(c.core.timers.tcp_established, Duration::from_secs(7200));
    assert_eq!(c.core.health.panic_threshold_percent, 50);
    assert_eq!(c.status, Some("127.0.0.1:9090".parse().unwrap()));
    let w = c.warnings.join("\n");
    for expected in [
        "`traffic_window` is a deprecated spelling (snake_case); write `traffic-window`",
        "`max_sessions` is a deprecated spelling (snake_case); write `max-sessions` (at pool.members[0].max-sessions)",
        "`panic_threshold` is a deprecated spelling",
        "pool.traffic-window: a bare number of seconds is deprecated; write \"20s\"",
        "timers.tcp-established: a bare number of seconds is deprecated; write \"2h\"",
        "`[status] address` is deprecated; write `metrics = \"ADDR:PORT\"`",
    ] {
        assert!(w.contains(expected), "no {expected:?} in\n{w}");
    }
    // The deprecated flags too.
    let args = LsnatArgs {
        listen: vec!["127.0.0.1:8080".into()],
        pool_handle: Some("P".into()),
        registrar: vec!["127.0.0.1:3863".into()],
        registrar_transport: Some("tcp".into()),
        status: Some("127.0.0.1:9091".into()),
        ..LsnatArgs::default()
    };
    let c = args.load().unwrap();
    assert_eq!(c.status, Some("127.0.0.1:9091".parse().unwrap()));
    assert_eq!(
        c.rserpool.unwrap().transport,
        rserpool_transport::TransportChoice::Tcp
    );
    let w = c.warnings.join("\n");
    assert!(w.contains("--status is deprecated; write --metrics"), "{w}");
    assert!(
        w.contains("--registrar-transport is deprecated; write --transport"),
        "{w}"
    );
}

#[test]
fn defaults_are_the_rfc_floors() {
    let c = parse(
        "[[listener]]\naddress = \"127.0.0.1:80\"\n[pool]\nmembers = [{ address = \"127.0.0.1:81\" }]\n",
    )
    .unwrap();
    let t = &c.core.timers;
    assert_eq!(t.tcp_established, Duration::from_secs(7440));
    assert_eq!(t.tcp_transitory, Duration::from_secs(240));
    assert_eq!(t.tcp_rst_linger, Duration::from_secs(240));
    assert_eq!(t.udp, Duration::from_secs(300));
    assert!(c.warnings.is_empty());
    assert_eq!(c.core.policy, LoadSharePolicy::RoundRobin);
    assert_eq!(
        (c.runtime.buffer_size, c.runtime.pipe_size),
        (16_384, 262_144)
    );
}

#[test]
fn malformed_files_name_the_field() {
    let base = "[[listener]]\naddress = \"127.0.0.1:80\"\n";
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\", wieght = 2 }}]\n"
    ));
    assert!(e.contains("wieght") && e.contains("line 4"), "{e}");
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"localhost\" }}]\n"
    ));
    assert!(e.contains("pool.members[0].address"), "{e}");
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\", weight = -1 }}]\n"
    ));
    assert!(e.contains("pool.members[0].weight"), "{e}");
    let e = error(&format!(
        "{base}[pool]\npolicy = \"fastest\"\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n"
    ));
    assert!(
        e.contains("pool.policy") && e.contains("round-robin"),
        "{e}"
    );
    let e = error(&format!(
        "{base}[pool]\npolicy = \"pool\"\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n"
    ));
    assert!(e.contains("RSerPool member source"), "{e}");
    let e = error(&format!("{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[timers]\nudp = \"5 parsecs\"\n"));
    assert!(e.contains("timers.udp"), "{e}");
    let e = error(&format!("{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[health]\npanic_threshold = 150\n"));
    assert!(
        e.contains("health.panic-threshold") && e.contains("0..=100"),
        "{e}"
    );
    let e = error(&format!("{base}[pool]\nmembers = []\n"));
    assert!(e.contains("pool.members"), "{e}");
    let e = error("[pool]\nmembers = [{ address = \"127.0.0.1:81\" }]\n");
    assert!(e.contains("listener"), "{e}");
    let e = error(&format!("{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}, {{ address = \"127.0.0.1:81\" }}]\n"));
    assert!(
        e.contains("pool.members[1].address") && e.contains("twice"),
        "{e}"
    );
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[health]\nprobe = \"udp\"\n"
    ));
    assert!(e.contains("health.send"), "{e}");
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\", cost = \"far\" }}]\n"
    ));
    assert!(e.contains("pool.members[0].cost"), "{e}");
    let e = error("this is not toml");
    assert!(e.contains("line 1"), "{e}");
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[limits]\nmax-sessions = 0\n"
    ));
    assert!(e.contains("limits.max-sessions"), "{e}");
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[runtime]\npipe-size = 1024\n"
    ));
    assert!(
        e.contains("runtime.pipe-size") && e.contains("4096..="),
        "{e}"
    );
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[runtime]\nbuffer-size = 10\n"
    ));
    assert!(e.contains("runtime.buffer-size"), "{e}");
    let e = error(&format!(
        "{base}[pool]\nmembers = [{{ address = \"127.0.0.1:81\" }}]\n[runtime]\nscheduling = \"fifo\"\n"
    ));
    assert!(
        e.contains("runtime.scheduling") && e.contains("\"fifo\" is not"),
        "{e}"
    );
}

#[test]
fn flags_alone_make_a_configuration() {
    let args = LsnatArgs {
        listen: vec!["udp:127.0.0.1:5353".into(), "[::1]:8080".into()],
        member: vec![
            "127.0.0.1:9000,3".into(),
            "127.0.0.1:9001,1,unreachable".into(),
        ],
        policy: Some("wrr".into()),
        metrics: Some("127.0.0.1:0".into()),
        threads: Some(1),
        ..LsnatArgs::default()
    };
    let c = args.load().unwrap();
    assert_eq!(c.listeners[0].protocol, Protocol::Udp);
    assert_eq!(c.listeners[1].protocol, Protocol::Tcp);
    assert_eq!(c.members[0].weight, 3);
    assert_eq!(c.members[1].cost, Cost::Unreachable);
    assert_eq!(c.core.policy, LoadSharePolicy::WeightedRoundRobin);
    assert_eq!(c.runtime.worker_threads, Some(1));
    let bad = LsnatArgs {
        listen: vec!["127.0.0.1:1".into()],
        member: vec!["127.0.0.1:9000,heavy".into()],
        ..LsnatArgs::default()
    };
    let e = bad.load().unwrap_err().to_string();
    assert!(e.contains("--member[0]"), "{e}");
}

#[test]
fn durations_parse() {
    assert_eq!(parse_duration("2h4m").unwrap(), Duration::from_secs(7440));
    assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
    assert!(parse_duration("").is_err());
    assert!(parse_duration("ms").is_err());
    // A unit is needed (a bare number in a file is read for one release, with a warning).
    let e = parse_duration("30").unwrap_err();
    assert!(e.contains("\"30s\""), "{e}");
    assert!(parse_duration("99999999999999999999999s").is_err());
}

#[test]
fn command_line_parses_into_lsnat_args() {
    use clap::{CommandFactory, Parser};
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LsnatArgs,
    }
    Cli::command().debug_assert();
    let cli = Cli::try_parse_from([
        "lsnat",
        "--listen",
        "127.0.0.1:8080",
        "--listen",
        "udp:127.0.0.1:5353",
        "--member",
        "127.0.0.1:9000,2",
        "--policy",
        "least-sessions",
        "--metrics",
        "127.0.0.1:9090",
        "--threads",
        "1",
        "--check",
    ])
    .unwrap();
    assert!(cli.args.check);
    let c = cli.args.load().unwrap();
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.core.policy, LoadSharePolicy::LeastSessions);
    assert!(Cli::try_parse_from(["lsnat", "--threads", "many"]).is_err());
}

#[test]
fn check_refuses_what_would_bite_at_run_time() {
    let e = error("[[listener]]\naddress = \"127.0.0.1:8080\"\n[pool]\nmembers = [{ address = \"127.0.0.1:9000\" }, { address = \"127.0.0.1:8080\" }]\n");
    assert!(
        e.contains("pool.members[1].address") && e.contains("the gateway's own listener[0]"),
        "{e}"
    );
    let e = error("[[listener]]\naddress = \"0.0.0.0:8080\"\n[pool]\nmembers = [{ address = \"127.0.0.1:8080\" }]\n");
    assert!(
        e.contains("own listener"),
        "a wildcard listener covers 127.0.0.1: {e}"
    );
    let e = error("metrics = \"127.0.0.1:8080\"\n[[listener]]\naddress = \"127.0.0.1:8080\"\n[pool]\nmembers = [{ address = \"127.0.0.1:9000\" }]\n");
    assert!(
        e.contains("field `metrics`") && e.contains("also listener[0]"),
        "{e}"
    );
    let e = error("[[listener]]\naddress = \"127.0.0.1:8080\"\n[pool]\nmembers = [{ address = \"127.0.0.1:9000\", weight = 0 }, { address = \"127.0.0.1:9001\", cost = \"unreachable\" }, { address = \"127.0.0.1:9002\", max-sessions = 0 }]\n");
    assert!(e.contains("no member can ever take a session"), "{e}");
    let c = parse("[[listener]]\naddress = \"127.0.0.1:8080\"\n[pool]\nmembers = [{ address = \"127.0.0.1:9000\" }]\n[health]\ninterval = \"1s\"\ntimeout = \"3s\"\n").unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("health.timeout (3s) is longer than health.interval (1s)")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn the_summary_speaks_words_and_human_durations() {
    let c = parse(GOOD).unwrap();
    let s = rserpool_lsnat::summary(&c);
    for rust in ["Finite(", "None", "0ns", "Some(", "Tcp", "{"] {
        assert!(!s.contains(rust), "{rust:?} in\n{s}");
    }
    assert!(s.contains("cost 10"), "{s}");
    assert!(s.contains("cost unreachable"), "{s}");
    assert!(s.contains("probe: tcp every 500ms (timeout 400ms)"), "{s}");
    assert!(s.contains("tcp established 2h,"), "{s}");
    assert!(s.contains("persistence: 5m"), "{s}");
    assert!(
        s.contains("mode: proxy, the relay with one worker thread per CPU (")
            && s.contains("), scheduling batch, buffer 16384 bytes, splice on (pipe 262144 bytes)"),
        "{s}"
    );
    let d = parse("[[listener]]\naddress = \"127.0.0.1:80\"\nprotocol = \"udp\"\n[pool]\nmembers = [{ address = \"127.0.0.1:81\" }]\n").unwrap();
    let s = rserpool_lsnat::summary(&d);
    assert!(s.contains("probe: none"), "{s}");
    assert!(s.contains("persistence: off"), "{s}");
    assert!(s.contains("tcp established 2h 4m,"), "{s}");
    let t = parse("[[listener]]\naddress = \"127.0.0.1:80\"\n[pool]\nmembers = [{ address = \"127.0.0.1:81\" }]\n[runtime]\nworker-threads = 3\nsplice = false\nscheduling = \"normal\"\n").unwrap();
    let s = rserpool_lsnat::summary(&t);
    assert!(
        s.contains("mode: proxy, the relay with 3 worker threads, scheduling normal, buffer 16384 bytes, splice off"),
        "{s}"
    );
    let base = "[[listener]]\naddress = \"127.0.0.1:80\"\n[pool]\nmembers = [{ address = \"127.0.0.1:81\" }]\n";
    let s = rserpool_lsnat::summary(&parse(&format!("mode = \"nat\"\n{base}")).unwrap());
    assert!(
        s.contains("mode: nat (the kernel translates; without it, the relay with"),
        "{s}"
    );
    let s = rserpool_lsnat::summary(
        &parse(&format!("mode = \"nat\"\n{base}[nat]\nrequired = true\n")).unwrap(),
    );
    assert!(
        s.contains("mode: nat (the kernel translates; without it the gateway does not start)"),
        "{s}"
    );
    // NAT mode says whose limits and timers hold: conntrack's, the relay's only on fallback.
    assert!(
        s.contains("\nlimits: conntrack's table (net.netfilter.nf_conntrack_max) and each member's own max-sessions\n"),
        "{s}"
    );
    assert!(
        s.contains("\ntimers: conntrack's (net.netfilter.nf_conntrack_*_timeout*)\n"),
        "{s}"
    );
    assert!(
        s.contains("\nnat: table rserpool_lsnat, events answer (read every 5ms under load, socket buffer 8388608 bytes growing to 268435456, filter on), conntrack accounting on, source-nat off, map of up to 256 slots refreshed every 100ms\n"),
        "{s}"
    );
    let s = rserpool_lsnat::summary(
        &parse(&format!(
            "mode = \"nat\"\n{base}[nat]\nsource-nat = \"masquerade\"\nevent-interval = \"0s\"\nevents = \"end\"\n"
        ))
        .unwrap(),
    );
    assert!(
        s.contains("; the relay's if it falls back: 10000 sessions, 16384 per member\n"),
        "{s}"
    );
    assert!(
        s.contains("; the relay's if it falls back: tcp established 2h 4m,"),
        "{s}"
    );
    assert!(
        s.contains("events end (read as they arrive,") && s.contains("source-nat masquerade,"),
        "{s}"
    );
    let s = rserpool_lsnat::summary(&parse(base).unwrap());
    assert!(!s.contains("\nnat:") && !s.contains("conntrack"), "{s}");
    assert!(
        s.contains("\nlimits: 10000 sessions, 16384 per member\n"),
        "{s}"
    );
}
