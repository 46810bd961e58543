//! Echo, Discard, Daytime and CharGen as RSPLIB's rspserver has them; the registry and the TOML
//! configuration.

use rserpool_services::standard::{CharGenConfig, CharGenServer, DaytimeConfig, DaytimeServer};
use rserpool_services::{
    ConfigError, CookieRefused, Now, ServerOutput, ServiceConfig, ServiceError, ServiceKind,
    SessionId, SessionInfo,
};
use std::time::Duration;

fn now() -> Now {
    Now::from_monotonic(Duration::ZERO)
}

#[test]
fn echo_returns_each_message_with_its_ppid_and_stream() {
    let mut echo = ServiceConfig::default().server(ServiceKind::Echo).unwrap();
    echo.open_session(now(), SessionId(1), SessionInfo::default());
    echo.handle_message(now(), SessionId(1), 0, 0, b"line\n")
        .unwrap();
    echo.handle_message(now(), SessionId(1), 38, 3, b"\x00\xff")
        .unwrap();
    assert_eq!(
        echo.poll_output(),
        Some(ServerOutput::Send {
            session: SessionId(1),
            ppid: 0,
            stream: 0,
            data: b"line\n".to_vec()
        })
    );
    assert_eq!(
        echo.poll_output(),
        Some(ServerOutput::Send {
            session: SessionId(1),
            ppid: 38,
            stream: 3,
            data: vec![0, 255]
        })
    );
    assert_eq!(echo.poll_output(), None);
    assert_eq!(
        echo.handle_message(now(), SessionId(2), 0, 0, b"x"),
        Err(ServiceError::UnknownSession(SessionId(2)))
    );
    // A cookie echo to a stateless service restores nothing and aborts nothing.
    assert_eq!(
        echo.handle_cookie_echo(now(), SessionId(1), b"c"),
        Err(CookieRefused::NotSupported)
    );
    assert_eq!(echo.poll_output(), None);
    echo.close_session(now(), SessionId(1));
    assert_eq!(echo.sessions(), 0);
}

#[test]
fn discard_sends_nothing() {
    let mut discard = ServiceConfig::default()
        .server(ServiceKind::Discard)
        .unwrap();
    discard.open_session(now(), SessionId(1), SessionInfo::default());
    discard
        .handle_message(now(), SessionId(1), 0, 0, &[0; 1000])
        .unwrap();
    assert_eq!(discard.poll_output(), None);
}

#[test]
fn daytime_sends_one_line_then_closes() {
    let mut daytime = DaytimeServer::new(DaytimeConfig {
        utc_offset_secs: 3600,
    });
    // 2026-12-01 11:50:00.000042 UTC
    let at = Now::new(Duration::ZERO, Duration::from_micros(1_796_125_800_000_042));
    rserpool_services::ServerService::open_session(
        &mut daytime,
        at,
        SessionId(5),
        SessionInfo::default(),
    );
    let out: Vec<_> =
        std::iter::from_fn(|| rserpool_services::ServerService::poll_output(&mut daytime))
            .collect();
    assert_eq!(
        out,
        [
            ServerOutput::Send {
                session: SessionId(5),
                ppid: 0,
                stream: 0,
                data: b"Tuesday, 01-December-2026 12:50:00.000042\n".to_vec()
            },
            ServerOutput::Shutdown {
                session: SessionId(5)
            }
        ]
    );
}

#[test]
fn chargen_sends_rsplib_pattern_while_writable() {
    let mut chargen = CharGenServer::new(CharGenConfig {
        message_size: 1024,
        burst: 2,
    });
    use rserpool_services::ServerService;
    chargen.open_session(now(), SessionId(1), SessionInfo::default());
    let first: Vec<_> = std::iter::from_fn(|| chargen.poll_output()).collect();
    assert_eq!(first.len(), 2);
    let ServerOutput::Send { ppid, data, .. } = &first[0] else {
        panic!()
    };
    assert_eq!(*ppid, 0);
    assert_eq!(data.len(), 1024);
    assert!(data
        .iter()
        .enumerate()
        .all(|(i, &b)| usize::from(b) == 30 + i % 98));
    assert_eq!((data[0], data[97], data[98]), (30, 127, 30));
    chargen.writable(now(), SessionId(1));
    assert_eq!(std::iter::from_fn(|| chargen.poll_output()).count(), 2);
    chargen.close_session(now(), SessionId(1));
    chargen.writable(now(), SessionId(1));
    assert_eq!(chargen.poll_output(), None);
}

#[test]
fn registry_names_pools_and_ppids() {
    let table: Vec<_> = ServiceKind::ALL
        .iter()
        .map(|k| {
            (
                k.name(),
                k.default_pool_handle(),
                k.ppid(),
                k.rspserver_option(),
            )
        })
        .collect();
    assert_eq!(
        table,
        [
            ("echo", "EchoPool", None, "-echo"),
            ("discard", "DiscardPool", None, "-discard"),
            ("daytime", "DaytimePool", Some(0), "-daytime"),
            ("chargen", "CharGenPool", Some(0), "-chargen"),
            ("pingpong", "PingPongPool", Some(33), "-pingpong"),
            ("calcapp", "CalcAppPool", Some(34), "-calcapp"),
        ]
    );
    assert_eq!(
        "-PingPong".parse::<ServiceKind>().unwrap(),
        ServiceKind::PingPong
    );
    assert!("fractal"
        .parse::<ServiceKind>()
        .unwrap_err()
        .to_string()
        .contains("known: echo"));
    for kind in ServiceKind::ALL {
        let config = ServiceConfig::default();
        assert_eq!(config.server(kind).unwrap().kind(), kind);
        assert_eq!(config.client(kind).is_some(), kind.has_client());
    }
}

#[test]
fn toml_configuration_with_a_key_file() {
    let dir = std::env::temp_dir().join(format!("rserpool-services-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("pool.key");
    std::fs::write(
        &key,
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n",
    )
    .unwrap();
    let text = format!(
        r#"
        [cookie]
        key-file = "{}"
        lifetime = "2m"
        require-binding = true

        [pingpong]
        failure-after = 5

        [calcapp]
        capacity = 2000000.0
        max-jobs = 4
        keep-alive-interval = "1s 500ms"

        [pingpong-client]
        interval = "100ms"
        count = 10

        [calcapp-client]
        job-interval = "3s"
        "#,
        key.display()
    );
    let config: ServiceConfig = toml::from_str(&text).unwrap();
    assert_eq!(config.cookie.lifetime, Duration::from_secs(120));
    assert_eq!(
        config.calcapp.keep_alive_interval,
        Duration::from_millis(1500)
    );
    assert_eq!(config.pingpong_client.count, Some(10));
    assert!(config.cookie.seal().unwrap().is_signed());
    assert!(!ServiceConfig::default().cookie.seal().unwrap().is_signed());

    // An unknown key is named; a missing key file is an error, not plain cookies.
    let e = toml::from_str::<ServiceConfig>("[calcapp]\ncapacityy = 1.0\n").unwrap_err();
    assert!(e.to_string().contains("capacityy"), "{e}");
    let mut missing = config.clone();
    missing.cookie.key_file = Some(dir.join("nope"));
    assert!(matches!(
        missing.server(ServiceKind::PingPong),
        Err(ConfigError::Key(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn invalid_settings_are_named() {
    for (text, key) in [
        ("[calcapp]\ncapacity = 0.0\n", "calcapp.capacity"),
        ("[calcapp]\nmax-jobs = 0\n", "calcapp.max-jobs"),
        (
            "[calcapp]\nkeep-alive-interval = \"50ms\"\n",
            "calcapp.keep-alive-interval",
        ),
        ("[chargen]\nmessage-size = 70000\n", "chargen.message-size"),
        (
            "[pingpong-client]\ninterval = \"0s\"\n",
            "pingpong-client.interval",
        ),
        ("[cookie]\nmax-size = 16\n", "cookie.max-size"),
    ] {
        let config: ServiceConfig = toml::from_str(text).unwrap();
        match config.server(ServiceKind::CalcApp) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{text}: {other:?}"),
        }
    }
    ServiceConfig::default().validate().unwrap();
}

/// The TOML block of docs/services.md parses and gives exactly the defaults.
#[test]
fn documented_configuration_is_the_default() {
    let doc = include_str!("../../../docs/services.md");
    let start = doc.find("```toml\n").expect("a toml block") + 8;
    let end = start + doc[start..].find("```").unwrap();
    let config: ServiceConfig = toml::from_str(&doc[start..end]).unwrap();
    assert_eq!(config, ServiceConfig::default());
}
