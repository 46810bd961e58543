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
    // Checked before anything touches the kernel, so this runs without root.
    let c = Config::from_toml(
        "mode = \"nat\"\n[[listener]]\naddress = \"[::1]:8080\"\n[pool]\nmembers = [{ address = \"[::1]:80\" }]\n",
        "test.toml",
        &Overrides::default(),
    )
    .unwrap();
    let e = rserpool_lsnat::nat::prepare(&c)
        .err()
        .expect("IPv6 is refused");
    assert!(e.contains("IPv4"), "{e}");
    let c = load("mode = \"nat\"", "")
        .map(|mut c| {
            c.listeners[0].address = "0.0.0.0:8080".parse().unwrap();
            c
        })
        .unwrap();
    assert!(rserpool_lsnat::nat::prepare(&c).is_err());
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
        // An IPv6 listener cannot be translated: the proxy serves it.
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
}
