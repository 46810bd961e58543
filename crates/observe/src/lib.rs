//! The observability layer every rserpool daemon shares.
//!
//! - [`MetricSet`]: a daemon's counters and gauges as of one scrape, encoded by
//!   `prometheus-client` (OpenMetrics text, which Prometheus reads). The protocol cores keep
//!   plain integer counters and describe them here at scrape time; no metric text is written by
//!   hand. This part has no runtime and no I/O, so the sans-IO cores use it without tokio.
//! - [`server`] (feature `server`): one HTTP endpoint on hyper and axum serving `/metrics`,
//!   `/healthz` and `/status` (JSON), with the same limits for every daemon.
//!
//! Every metric is named `rserpool_<component>_…`; counters end in `_total`.

#![warn(missing_docs)]

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt::Write;

#[cfg(feature = "server")]
pub mod server;

/// The content type of [`MetricSet::render`]'s text.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether a family counts (monotonic) or measures (current value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic counter; its samples end in `_total`.
    Counter,
    /// A current value.
    Gauge,
}

impl Kind {
    /// `counter` or `gauge`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One sample: its labels and value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    labels: Vec<(String, Escaped)>,
    value: i64,
}

/// One metric family.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The sample name (with `_total` for counters).
    pub name: String,
    /// What it means.
    pub help: String,
    /// Counter or gauge.
    pub kind: Kind,
    /// The label names its samples carry (those of the first sample).
    pub label_names: Vec<String>,
    samples: Vec<Sample>,
}

impl Family {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether it has no sample (a per-member family of a gateway without members).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// The metrics of a daemon as of now, to be encoded by `prometheus-client`.
///
/// Build it from the cores' counters at scrape time (`counter`, `gauge`, `family`), then
/// [`render`](Self::render) it. Values are integers: every rserpool metric counts something.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricSet {
    families: Vec<Family>,
}

/// Adds labelled samples to a family of a [`MetricSet`].
pub struct FamilyBuilder<'a> {
    family: &'a mut Family,
}

impl FamilyBuilder<'_> {
    /// Adds one sample with the given labels (values are escaped as the text format wants).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: u64) -> &mut Self {
        if self.family.samples.is_empty() {
            self.family.label_names = labels.iter().map(|(k, _)| k.to_string()).collect();
        }
        self.family.samples.push(Sample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), Escaped(v.to_string())))
                .collect(),
            value: clamp(value),
        });
        self
    }

    /// Adds one sample with a signed value (gauges).
    pub fn sample_signed(&mut self, labels: &[(&str, &str)], value: i64) -> &mut Self {
        self.sample(labels, 0);
        if let Some(s) = self.family.samples.last_mut() {
            s.value = value;
        }
        self
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl MetricSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A family without samples yet; `name` is the sample name (counters end in `_total`).
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> FamilyBuilder<'_> {
        debug_assert!(
            kind != Kind::Counter || name.ends_with("_total"),
            "counter {name} must end in _total"
        );
        debug_assert!(name.starts_with("rserpool_"), "{name}: not rserpool_…");
        self.families.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            label_names: Vec::new(),
            samples: Vec::new(),
        });
        FamilyBuilder {
            family: self.families.last_mut().expect("just pushed"),
        }
    }

    /// An unlabelled counter (`name` ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.family(name, Kind::Counter, help).sample(&[], value);
        self
    }

    /// An unlabelled gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.family(name, Kind::Gauge, help).sample(&[], value);
        self
    }

    /// Appends the families of another set.
    pub fn extend(&mut self, other: MetricSet) {
        self.families.extend(other.families);
    }

    /// The families, in the order they are rendered.
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// The value of a sample, e.g. for tests: `name` and exactly these labels.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<i64> {
        self.families
            .iter()
            .filter(|f| f.name == name)
            .flat_map(|f| f.samples.iter())
            .find(|s| {
                s.labels.len() == labels.len()
                    && s.labels
                        .iter()
                        .zip(labels)
                        .all(|((k, v), (k2, v2))| k == k2 && v.0 == *v2)
            })
            .map(|s| s.value)
    }

    /// The set in the OpenMetrics text format ([`METRICS_CONTENT_TYPE`]), as
    /// `prometheus-client`'s encoder writes it, ending in `# EOF`.
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot(self.families)));
        let mut out = String::with_capacity(4096);
        // Writing into a String fails only when a collector fails, and ours does not.
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
            let _ = writeln!(out, "# EOF");
        }
        out
    }
}

/// A label value, escaped for the text format (backslash, double quote, line feed).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Escaped(String);

impl EncodeLabelValue for Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// The families of one scrape, handed to `prometheus-client` as a collector.
#[derive(Debug)]
struct Snapshot(Vec<Family>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let (name, metric_type) = match f.kind {
                // The encoder appends `_total` to a counter's samples.
                Kind::Counter => (
                    f.name.strip_suffix("_total").unwrap_or(&f.name),
                    MetricType::Counter,
                ),
                Kind::Gauge => (f.name.as_str(), MetricType::Gauge),
            };
            let mut family = encoder.encode_descriptor(name, &f.help, None, metric_type)?;
            if let [one] = f.samples.as_slice() {
                if one.labels.is_empty() {
                    // An unlabelled metric: the sample goes on the descriptor's encoder.
                    match f.kind {
                        Kind::Counter => {
                            ConstCounter::new(one.value.max(0) as u64).encode(family)?
                        }
                        Kind::Gauge => ConstGauge::new(one.value).encode(family)?,
                    }
                    continue;
                }
            }
            for s in &f.samples {
                let labels: Vec<(&str, &Escaped)> =
                    s.labels.iter().map(|(k, v)| (k.as_str(), v)).collect();
                let m = family.encode_family(&labels)?;
                match f.kind {
                    Kind::Counter => ConstCounter::new(s.value.max(0) as u64).encode(m)?,
                    Kind::Gauge => ConstGauge::new(s.value).encode(m)?,
                }
            }
        }
        Ok(())
    }
}

impl EncodeLabelValue for &Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        (*self).encode(encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_escaped_labels() {
        let mut m = MetricSet::new();
        m.counter("rserpool_x_things_total", "Things.", 3);
        m.gauge("rserpool_x_now", "Now.", 7);
        m.family("rserpool_x_by_total", Kind::Counter, "By key.")
            .sample(&[("key", "a\"b\\c\nd")], 2)
            .sample(&[("key", "plain")], 0);
        let text = m.render();
        assert!(
            text.contains("# TYPE rserpool_x_things counter\n"),
            "{text}"
        );
        assert!(text.contains("\nrserpool_x_things_total 3\n"), "{text}");
        assert!(
            text.contains("# TYPE rserpool_x_now gauge\nrserpool_x_now 7\n"),
            "{text}"
        );
        assert!(
            text.contains("rserpool_x_by_total{key=\"a\\\"b\\\\c\\nd\"} 2\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn huge_values_saturate_instead_of_failing_the_scrape() {
        let mut m = MetricSet::new();
        m.gauge("rserpool_x_big", "Big.", u64::MAX);
        let text = m.render();
        assert!(
            text.contains(&format!("rserpool_x_big {}\n", i64::MAX)),
            "{text}"
        );
    }

    #[test]
    fn value_finds_a_sample() {
        let mut m = MetricSet::new();
        m.family("rserpool_x_by_total", Kind::Counter, "By key.")
            .sample(&[("key", "a")], 2);
        assert_eq!(m.value("rserpool_x_by_total", &[("key", "a")]), Some(2));
        assert_eq!(m.value("rserpool_x_by_total", &[("key", "b")]), None);
    }
}
