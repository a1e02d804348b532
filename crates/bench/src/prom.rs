//! The per-hop latency breakdown: Prometheus histograms scraped before and after a load, the
//! difference of their buckets read as a distribution.
//!
//! The text format is read here, not with a parser crate: the one maintained candidate
//! (`prometheus-parse`, last released 2023) would bring `chrono`, `regex` and a second
//! `itertools` for the line splitting alone, and what the bench needs beyond that (histogram
//! samples selected by labels and summed over the rest, `_sum`/`_count` included, two scrapes
//! differenced) would stay here anyway. The input is our own exporter's output, whose label
//! values never hold `",`.

use std::collections::BTreeMap;

use serde::Serialize;

/// One scrape: every sample line, keyed by its name and labels as written.
#[derive(Debug, Clone, Default)]
pub struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    pub fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|line| !line.starts_with('#') && !line.trim().is_empty()) {
            if let Some((key, value)) = line.rsplit_once(' ') {
                if let Ok(value) = value.parse::<f64>() {
                    samples.insert(key.to_owned(), value);
                }
            }
        }
        Self(samples)
    }

    /// Bucket counts (upper bound, cumulative count) of histogram `name` whose labels match
    /// `filter`, summed over the other labels.
    fn buckets(&self, name: &str, filter: &Filter<'_>) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{");
        let mut by_bound: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for (key, value) in &self.0 {
            let Some(labels) = key.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix('}')) else {
                continue;
            };
            let labels = parse_labels(labels);
            if !matches(&labels, filter) {
                continue;
            }
            let Some(le) = labels.get("le") else { continue };
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
            let entry = by_bound.entry(bound.to_bits()).or_insert((bound, 0.0));
            entry.1 += value;
        }
        let mut buckets: Vec<(f64, f64)> = by_bound.into_values().collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }

    fn sum_count(&self, name: &str, filter: &Filter<'_>) -> (f64, f64) {
        let mut totals = (0.0, 0.0);
        for (key, value) in &self.0 {
            for (suffix, slot) in [("_sum", 0), ("_count", 1)] {
                let Some(rest) = key.strip_prefix(name).and_then(|rest| rest.strip_prefix(suffix)) else {
                    continue;
                };
                let labels = rest.strip_prefix('{').and_then(|rest| rest.strip_suffix('}')).unwrap_or("");
                if !rest.is_empty() && !rest.starts_with('{') {
                    continue;
                }
                let labels = parse_labels(labels);
                if matches(&labels, filter) {
                    if slot == 0 {
                        totals.0 += value;
                    } else {
                        totals.1 += value;
                    }
                }
            }
        }
        totals
    }
}

/// Which samples a hop sums: for each label name, the values it may have (any of them).
pub type Filter<'a> = [(&'a str, Vec<String>)];

fn matches(labels: &BTreeMap<String, String>, filter: &Filter<'_>) -> bool {
    filter.iter().all(|(name, values)| labels.get(*name).is_some_and(|value| values.contains(value)))
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    // label values here never contain `",` (they are our own names and numbers)
    text.split("\",")
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

/// One hop's figures over a load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Hop {
    pub count: u64,
    pub mean_ms: f64,
    /// Interpolated within the histogram's buckets (coarse: 1, 2.5, 5, 10, 25, 50, 100 ms …).
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Histogram `name` (filtered by labels) between two scrapes.
pub fn hop(before: &Scrape, after: &Scrape, name: &str, filter: &Filter<'_>) -> Option<Hop> {
    let (sum0, count0) = before.sum_count(name, filter);
    let (sum1, count1) = after.sum_count(name, filter);
    let count = count1 - count0;
    if count <= 0.0 {
        return None;
    }
    let earlier: BTreeMap<u64, f64> =
        before.buckets(name, filter).into_iter().map(|(bound, value)| (bound.to_bits(), value)).collect();
    let delta: Vec<(f64, f64)> = after
        .buckets(name, filter)
        .into_iter()
        .map(|(bound, value)| (bound, value - earlier.get(&bound.to_bits()).copied().unwrap_or(0.0)))
        .collect();
    Some(Hop {
        count: count as u64,
        mean_ms: round((sum1 - sum0) / count * 1_000.0),
        p50_ms: round(quantile(&delta, 0.50) * 1_000.0),
        p99_ms: round(quantile(&delta, 0.99) * 1_000.0),
    })
}

fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// The `q` quantile of cumulative buckets, interpolated linearly inside its bucket (as
/// Prometheus' `histogram_quantile` does); the last finite bound when it falls in `+Inf`.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else { return 0.0 };
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, cumulative) in buckets {
        if cumulative >= rank {
            if bound.is_infinite() {
                return lower.0;
            }
            let inside = cumulative - lower.1;
            let fraction = if inside > 0.0 { (rank - lower.1) / inside } else { 1.0 };
            return lower.0 + (bound - lower.0) * fraction;
        }
        lower = (bound, cumulative);
    }
    lower.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# TYPE outbox_delivery_seconds histogram
outbox_delivery_seconds_bucket{database="ledger",le="0.01"} 5
outbox_delivery_seconds_bucket{database="ledger",le="0.1"} 10
outbox_delivery_seconds_bucket{database="ledger",le="+Inf"} 10
outbox_delivery_seconds_sum{database="ledger"} 0.5
outbox_delivery_seconds_count{database="ledger"} 10
outbox_delivery_seconds_bucket{database="transferencias",le="0.01"} 100
outbox_delivery_seconds_bucket{database="transferencias",le="0.1"} 100
outbox_delivery_seconds_bucket{database="transferencias",le="+Inf"} 100
outbox_delivery_seconds_sum{database="transferencias"} 0.1
outbox_delivery_seconds_count{database="transferencias"} 100
"#;

    #[test]
    fn a_hop_is_the_difference_between_two_scrapes() {
        let after = BEFORE
            .replace("le=\"0.01\"} 5", "le=\"0.01\"} 55")
            .replace("le=\"0.1\"} 10", "le=\"0.1\"} 110")
            .replace("le=\"+Inf\"} 10\n", "le=\"+Inf\"} 110\n")
            .replace("_sum{database=\"ledger\"} 0.5", "_sum{database=\"ledger\"} 3.0")
            .replace("_count{database=\"ledger\"} 10", "_count{database=\"ledger\"} 110");
        let hop = hop(
            &Scrape::parse(BEFORE),
            &Scrape::parse(&after),
            "outbox_delivery_seconds",
            &[("database", vec!["ledger".into()])],
        )
        .expect("traffic");
        assert_eq!(hop.count, 100);
        assert_eq!(hop.mean_ms, 25.0);
        // 50 of 100 under 10 ms, the other 50 between 10 and 100 ms
        assert_eq!(hop.p50_ms, 10.0);
        assert_eq!(hop.p99_ms, 98.2);
        // no traffic, no figures
        assert!(super::hop(&Scrape::parse(BEFORE), &Scrape::parse(BEFORE), "outbox_delivery_seconds", &[])
            .is_none());
    }

    #[test]
    fn a_hop_may_sum_several_values_of_a_label() {
        let before = "kafka_batch_handling_seconds_bucket{group=\"p.a\",le=\"0.01\"} 0\n\
kafka_batch_handling_seconds_bucket{group=\"p.a\",le=\"+Inf\"} 0\n\
kafka_batch_handling_seconds_sum{group=\"p.a\"} 0\n\
kafka_batch_handling_seconds_count{group=\"p.a\"} 0\n";
        let after = "kafka_batch_handling_seconds_bucket{group=\"p.a\",le=\"0.01\"} 3\n\
kafka_batch_handling_seconds_bucket{group=\"p.a\",le=\"+Inf\"} 3\n\
kafka_batch_handling_seconds_sum{group=\"p.a\"} 0.015\n\
kafka_batch_handling_seconds_count{group=\"p.a\"} 3\n\
kafka_batch_handling_seconds_bucket{group=\"p.b\",le=\"0.01\"} 1\n\
kafka_batch_handling_seconds_bucket{group=\"p.b\",le=\"+Inf\"} 1\n\
kafka_batch_handling_seconds_sum{group=\"p.b\"} 0.005\n\
kafka_batch_handling_seconds_count{group=\"p.b\"} 1\n\
kafka_batch_handling_seconds_bucket{group=\"p.c\",le=\"0.01\"} 0\n\
kafka_batch_handling_seconds_bucket{group=\"p.c\",le=\"+Inf\"} 5\n\
kafka_batch_handling_seconds_sum{group=\"p.c\"} 5\n\
kafka_batch_handling_seconds_count{group=\"p.c\"} 5\n";
        let (before, after) = (Scrape::parse(before), Scrape::parse(after));
        let name = "kafka_batch_handling_seconds";
        let one = hop(&before, &after, name, &[("group", vec!["p.a".into()])]).expect("a");
        assert_eq!((one.count, one.mean_ms), (3, 5.0));
        let two = hop(&before, &after, name, &[("group", vec!["p.a".into(), "p.b".into()])]).expect("a, b");
        assert_eq!((two.count, two.mean_ms), (4, 5.0), "c is not summed");
        assert!(hop(&before, &after, name, &[("group", vec!["p.d".into()])]).is_none());
    }

    #[test]
    fn quantiles_interpolate_and_stop_at_the_last_finite_bound() {
        let buckets = [(0.001, 0.0), (0.01, 50.0), (f64::INFINITY, 100.0)];
        assert!((quantile(&buckets, 0.25) - 0.0055).abs() < 1e-9);
        assert_eq!(quantile(&buckets, 0.99), 0.01);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
