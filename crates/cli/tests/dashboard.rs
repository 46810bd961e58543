//! The Grafana dashboard of docs/grafana/rserpool.json asks only for what the daemons serve: every
//! metric its queries name is in the `/metrics` of a running registrar (with ENRP), pool element,
//! pool user and gateway (the NAT data plane's from its renderer, as NAT mode needs root), and
//! every label a query groups by is a label of that metric. The receipts stand side by side in one panel.

mod common;

use common::process::{endpoint_of, start_gateway, start_pe, start_pu};
use common::{metrics, start};
use rserpool_testkit::http;
use std::collections::{BTreeMap, BTreeSet};

/// Metric name → the label names it carries, from Prometheus text.
fn families(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if let Some(rest) = line[name_end..].strip_prefix('{') {
            for pair in rest.split('}').next().unwrap_or("").split(',') {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    out
}

/// The `/metrics` text served at `addr`.
fn get(addr: &str) -> String {
    http::get_blocking(addr, "/metrics")
        .expect("metrics endpoint")
        .body
}

/// The metric names a PromQL expression reads, and the labels it groups by.
fn names_and_groupings(expr: &str) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("rserpool_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    let mut groups = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        let tail = &rest[i + 4..];
        let end = tail.find(')').unwrap_or(tail.len());
        groups.extend(tail[..end].split(',').map(|s| s.trim().to_string()));
        rest = &tail[end..];
    }
    (names, groups)
}

#[test]
fn every_query_of_the_dashboard_names_served_metrics_and_labels() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/rserpool.json"
    ))
    .expect("docs/grafana/rserpool.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");

    // What the daemons serve.
    let registrar = start(0x6001, None);
    let (pe, _) = start_pe(&registrar.asap.to_string(), &["--service", "pingpong"]);
    let pe_metrics = endpoint_of(&pe);
    let (_pu, pu_metrics) = start_pu(&registrar.asap.to_string(), &[]);
    let (gateway, gateway_metrics, _dir) = start_gateway();
    let mut nat = String::new();
    rserpool_lsnat::nat::Stats::default().render_prometheus(&mut nat);
    let mut served = families(&metrics(&registrar));
    served.extend(families(&get(&pe_metrics)));
    served.extend(families(&get(&pu_metrics)));
    served.extend(families(&get(&gateway_metrics)));
    served.extend(families(&nat));
    assert!(
        served.contains_key("rserpool_registrar_enrp_peers"),
        "{served:?}"
    );
    assert!(served.contains_key("rserpool_pe_sessions"), "{served:?}");
    assert!(
        served.contains_key("rserpool_pu_reached_total"),
        "{served:?}"
    );
    assert!(
        served.contains_key("rserpool_lsnat_member_selected_total"),
        "{served:?}"
    );

    let mut exprs = Vec::new();
    let mut titles = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        titles.push(panel["title"].as_str().unwrap_or("").to_string());
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                panel["title"].as_str().unwrap_or("").to_string(),
                target["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    assert!(exprs.len() >= 30, "{} queries", exprs.len());
    for (title, expr) in &exprs {
        let (names, groups) = names_and_groupings(expr);
        assert!(
            !names.is_empty(),
            "{title}: {expr} reads no rserpool metric"
        );
        for name in &names {
            let labels = served
                .get(name)
                .unwrap_or_else(|| panic!("{title}: {expr}: {name} is served by no daemon"));
            for g in &groups {
                assert!(
                    labels.contains(g),
                    "{title}: {expr}: {name} has no label {g:?} (it has {labels:?})"
                );
            }
        }
    }
    // The receipts side by side: selected, bound, reached and outcome in one panel.
    let receipts: Vec<&String> = exprs
        .iter()
        .filter(|(t, _)| t.starts_with("Receipts per member"))
        .map(|(_, e)| e)
        .collect();
    for fact in ["selected", "bound", "reached", "outcomes"] {
        assert!(
            receipts
                .iter()
                .any(|e| e.contains(&format!("rserpool_lsnat_member_{fact}_total"))),
            "the receipts panel lacks {fact}: {receipts:?}"
        );
    }
    drop(gateway);
    drop(pe);
}
