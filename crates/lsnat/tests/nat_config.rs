//! NAT mode's configuration: `mode` and the `[nat]` section, with errors naming the field, and
//! the fallback to the proxy where the kernel cannot be programmed.

use rserpool_lsnat::config::Mode;
use rserpool_lsnat::nat::plan::SourceNat;
use rserpool_lsnat::{Config, ConfigError, Overrides};
use std::time::Duration;

const BASE: &str = r#"
[[listener]]
address = "10.0.1.2:8080"
[pool]
members = [{ address = "10.0.2.2:80" }]
"#;

fn load(extra_top: &str, extra: &str) -> Result<Config, ConfigError> {
    Config::from_toml(
        &format!("{extra_top}\n{BASE}\n{extra}"),
        "test.toml",
        &Overrides::default(),
    )
}

fn field_of(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { field, .. } => field,
        other => panic!("expected a field error, got {other}"),
    }
}

#[test]
fn proxy_is_the_default_and_nat_defaults_are_documented_values() {
    let c = load("", "").unwrap();
    assert_eq!(c.mode, Mode::Proxy);
    assert_eq!(c.nat.table, "rserpool_lsnat");
    assert_eq!(c.nat.source_nat, SourceNat::Off);
    assert_eq!(c.nat.refresh, Duration::from_millis(100));
    assert_eq!(c.nat.max_slots, 256);
    assert!(!c.nat.required);
}

#[test]
fn nat_section_is_read() {
    let c = load(
        "mode = \"nat\"",
        "[nat]\ntable = \"gw_1\"\nsource-nat = \"masquerade\"\nrefresh = \"50ms\"\nmax-slots = 64\nrequired = true\n",
    )
    .unwrap();
    assert_eq!(c.mode, Mode::Nat);
    assert_eq!(c.nat.table, "gw_1");
    assert_eq!(c.nat.source_nat, SourceNat::Masquerade);
    assert_eq!(c.nat.refresh, Duration::from_millis(50));
    assert_eq!(c.nat.max_slots, 64);
    assert!(c.nat.required);
    let c = load("", "[nat]\nsource-nat = \"10.0.2.1\"\n").unwrap();
    assert_eq!(c.nat.source_nat, SourceNat::To("10.0.2.1".parse().unwrap()));
}

#[test]
fn bad_values_name_their_field() {
    assert_eq!(field_of(load("mode = \"kernel\"", "").unwrap_err()), "mode");
    assert_eq!(
        field_of(load("", "[nat]\ntable = \"a b;\"\n").unwrap_err()),
        "nat.table"
    );
    assert_eq!(
        field_of(load("", "[nat]\nsource-nat = \"somewhere\"\n").unwrap_err()),
        "nat.source-nat"
    );
    assert_eq!(
        field_of(load("", "[nat]\nrefresh = \"1ms\"\n").unwrap_err()),
        "nat.refresh"
    );
    assert_eq!(
        field_of(load("", "[nat]\nmax-slots = 0\n").unwrap_err()),
        "nat.max-slots"
    );
    assert!(matches!(
        load("", "[nat]\nno-such-key = 1\n").unwrap_err(),
        ConfigError::Syntax { .. }
    ));
}

#[test]
fn the_mode_flag_overrides_the_file() {
    let ov = Overrides {
        mode: Some("nat".into()),
        ..Overrides::default()
    };
    let c = Config::from_toml(BASE, "test.toml", &ov).unwrap();
    assert_eq!(c.mode, Mode::Nat);
}

#[test]
fn nat_mode_refuses_listeners_it_cannot_translate() {
    // Checked before anything touches the kernel, so this runs without root (and as root
    // programs nothing).
    let c = Config::from_toml(
        "mode = \"nat\"\n[[listener]]\naddress = \"[::]:8080\"\n[pool]\nmembers = [{ address = \"[::1]:80\" }]\n",
        "test.toml",
        &Overrides::default(),
    )
    .unwrap();
    let e = rserpool_lsnat::nat::prepare(&c)
        .err()
        .expect("a wildcard is refused");
    assert!(
        e.contains("[::]:8080") && e.contains("one address and port"),
        "{e}"
    );
    let c = load("mode = \"nat\"", "")
        .map(|mut c| {
            c.listeners[0].address = "0.0.0.0:8080".parse().unwrap();
            c
        })
        .unwrap();
    assert!(rserpool_lsnat::nat::prepare(&c).is_err());
}

fn nat_toml(listeners: &[&str], members: &[&str], extra: &str) -> Result<Config, ConfigError> {
    let mut t = String::from("mode = \"nat\"\n");
    for l in listeners {
        t.push_str(&format!("[[listener]]\naddress = \"{l}\"\n"));
    }
    let ms: Vec<String> = members
        .iter()
        .map(|m| format!("{{ address = \"{m}\" }}"))
        .collect();
    t.push_str(&format!("[pool]\nmembers = [{}]\n{extra}", ms.join(", ")));
    Config::from_toml(&t, "test.toml", &Overrides::default())
}

#[test]
fn ipv6_listeners_run_in_nat_mode_with_their_own_client_prefix() {
    let c = nat_toml(
        &["[fd00:231:1::2]:8080"],
        &["[fd00:231:2::2]:7000", "[fd00:231:2::3]:7000"],
        "[persistence]\ntimeout = \"5m\"\nnetmask-v6 = 56\n",
    )
    .unwrap();
    assert_eq!(c.mode, Mode::Nat);
    assert_eq!(c.core.persistence.netmask_v6, 56);
    // The IPv6 table groups clients by netmask-v6, the IPv4 one by netmask-v4.
    use rserpool_lsnat::nat::plan::Family;
    let s6 = rserpool_lsnat::nat::table_settings(&c, Family::V6);
    assert_eq!(s6.family, Family::V6);
    assert_eq!(s6.table, "rserpool_lsnat");
    assert_eq!(s6.persistence, Some((56, Duration::from_secs(300))));
    let s4 = rserpool_lsnat::nat::table_settings(&c, Family::V4);
    assert_eq!(s4.persistence, Some((32, Duration::from_secs(300))));
    let e = nat_toml(
        &["[fd00:231:1::2]:8080"],
        &["[fd00:231:2::2]:7000"],
        "[persistence]\nnetmask-v6 = 129\n",
    )
    .unwrap_err();
    assert_eq!(field_of(e), "persistence.netmask-v6");
    // Mixed listeners: each family's members serve its listeners.
    let c = nat_toml(
        &["10.0.1.2:8080", "[fd00:231:1::2]:8080"],
        &["10.0.2.2:7000", "[fd00:231:2::2]:7000"],
        "[nat]\nsource-nat = \"masquerade\"\n",
    )
    .unwrap();
    assert_eq!(c.listeners.len(), 2);
    // A source address of one family cannot serve both.
    let e = nat_toml(
        &["10.0.1.2:8080", "[fd00:231:1::2]:8080"],
        &["10.0.2.2:7000", "[fd00:231:2::2]:7000"],
        "[nat]\nsource-nat = \"10.0.2.1\"\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("10.0.2.1"), "{e}");
    assert_eq!(field_of(e), "nat.source-nat");
    let c = nat_toml(
        &["[fd00:231:1::2]:8080"],
        &["[fd00:231:2::2]:7000"],
        "[nat]\nsource-nat = \"fd00:231:2::1\"\n",
    )
    .unwrap();
    assert_eq!(
        c.nat.source_nat,
        SourceNat::To("fd00:231:2::1".parse().unwrap())
    );
}

#[test]
fn nat_mode_refuses_a_member_of_another_family_than_the_listeners() {
    let e = nat_toml(
        &["10.0.1.2:8080"],
        &["10.0.2.2:7000", "[fd00:231:2::3]:7000"],
        "",
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("[fd00:231:2::3]:7000"), "{text}");
    assert!(text.contains("IPv6") && text.contains("IPv4"), "{text}");
    assert_eq!(field_of(e), "pool.members[1].address");
    let e = nat_toml(&["[fd00:231:1::2]:8080"], &["10.0.2.2:7000"], "").unwrap_err();
    assert!(e.to_string().contains("10.0.2.2:7000"), "{e}");
    assert_eq!(field_of(e), "pool.members[0].address");
    // The proxy relays between families: the same configuration is fine in proxy mode.
    let c = Config::from_toml(
        "[[listener]]\naddress = \"10.0.1.2:8080\"\n[pool]\nmembers = [{ address = \"[fd00:231:2::3]:7000\" }]\n",
        "test.toml",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.mode, Mode::Proxy);
}

/// Without root, `--mode nat` falls back to the proxy (and says so) unless `nat.required`.
#[tokio::test]
async fn without_root_nat_falls_back_to_the_proxy_or_refuses_when_required() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // As root, NAT would really be programmed; the netns test covers that path.
        let c = Config::from_toml(
            "mode = \"nat\"\n[[listener]]\naddress = \"[::1]:0\"\n[pool]\nmembers = [{ address = \"[::1]:80\" }]\n",
            "t",
            &Overrides::default(),
        )
        .unwrap();
        // A listener on port 0 cannot be translated: the proxy serves it.
        let src = rserpool_lsnat::member_source(&c);
        let r = rserpool_lsnat::start(c, src).await.unwrap();
        assert!(
            r.listener(rserpool_lsnat::core::Protocol::Tcp)
                .unwrap()
                .port()
                != 0
        );
        r.shutdown().await;
        return;
    }
    let c = load("mode = \"nat\"", "").unwrap();
    let mut c = c;
    c.listeners[0].address = "127.0.0.1:0".parse().unwrap();
    let src = rserpool_lsnat::member_source(&c);
    let r = rserpool_lsnat::start(c.clone(), src).await.unwrap();
    assert!(r.listener(rserpool_lsnat::core::Protocol::Tcp).is_some());
    r.shutdown().await;
    c.nat.required = true;
    let src = rserpool_lsnat::member_source(&c);
    assert!(rserpool_lsnat::start(c, src).await.is_err());
}

#[test]
fn which_conntrack_events_and_how_large_a_buffer() {
    use rserpool_lsnat::nat::plan::NatEvents;
    let c = load("", "").unwrap();
    assert_eq!(c.nat.events, NatEvents::Answer);
    assert_eq!(c.nat.event_buffer, 8 << 20);
    assert_eq!(c.nat.event_buffer_max, 256 << 20);
    for (text, want) in [
        ("answer", NatEvents::Answer),
        ("end", NatEvents::End),
        ("all", NatEvents::All),
    ] {
        let c = load("", &format!("[nat]\nevents = \"{text}\"\n")).unwrap();
        assert_eq!(c.nat.events, want);
        assert_eq!(want.name(), text);
    }
    let e = load("", "[nat]\nevents = \"some\"\n").unwrap_err();
    assert_eq!(field_of(e), "nat.events");
    // The ceiling cannot be below the starting size.
    let e = load(
        "",
        "[nat]\nevent-buffer = 1048576\nevent-buffer-max = 65536\n",
    )
    .unwrap_err();
    assert_eq!(field_of(e), "nat.event-buffer-max");
    let c = load(
        "",
        "[nat]\nevent-buffer = 1048576\nevent-buffer-max = 4194304\n",
    )
    .unwrap();
    assert_eq!(c.nat.event_buffer_max, 4 << 20);
    // Events are read on a 5 ms tick under load unless set otherwise; more than 1s is refused.
    assert_eq!(
        load("", "").unwrap().nat.event_interval,
        Duration::from_millis(5)
    );
    assert!(load("", "[nat]\nevent-interval = \"0s\"\n")
        .unwrap()
        .nat
        .event_interval
        .is_zero());
    let e = load("", "[nat]\nevent-interval = \"2s\"\n").unwrap_err();
    assert_eq!(field_of(e), "nat.event-interval");
    // The kernel-side event filter is on unless turned off.
    assert!(load("", "").unwrap().nat.event_filter);
    assert!(
        !load("", "[nat]\nevent-filter = false\n")
            .unwrap()
            .nat
            .event_filter
    );
}
