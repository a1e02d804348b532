//! The result: `docs/reference/contract.md` §1's JSON object, printed as loadgen's last line.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latencies from when a request was due to when its final status was seen, in microseconds
/// (1 µs to 1 h, 3 significant digits).
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"))
    }
}

impl Latencies {
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, self.0.high());
        // within bounds by the clamp, so recording cannot fail
        let _ = self.0.record(micros);
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `q` quantile in milliseconds (0 when nothing was recorded).
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        millis(self.0.value_at_quantile(q))
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            p50: self.quantile_ms(0.50),
            p95: self.quantile_ms(0.95),
            p99: self.quantile_ms(0.99),
            max: if self.0.is_empty() { 0.0 } else { millis(self.0.max()) },
        }
    }
}

fn millis(micros: u64) -> f64 {
    micros as f64 / 1_000.0
}

/// `latency_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// The contract's object: `{"sent","accepted","settled","rejected","lost","throughput_per_s",
/// "latency_ms":{"p50","p95","p99","max"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// POSTs made.
    pub sent: u64,
    /// Answered `202`.
    pub accepted: u64,
    /// Of the accepted, final `LIQUIDADA`.
    pub settled: u64,
    /// Of the accepted, final `REJEITADA`.
    pub rejected: u64,
    /// Accepted but not final (on the outcome topics and in the API) by the drain deadline.
    pub lost: u64,
    /// Final transfers per second, from the first send to the last final status.
    pub throughput_per_s: f64,
    /// From when each request was due to when its final status was seen.
    pub latency_ms: LatencySummary,
    /// Transfers with both a settlement and a rejection event: a broken pinned outcome. Not in
    /// the contract's JSON; it fails the run like a loss.
    #[serde(skip)]
    pub conflicting: u64,
}

impl Report {
    /// Nothing lost and no transfer with two different outcomes.
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.conflicting == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_has_the_contract_s_keys_in_order() {
        let mut latencies = Latencies::default();
        for ms in 1..=100u64 {
            latencies.record(Duration::from_millis(ms));
        }
        let report = Report {
            sent: 100,
            accepted: 100,
            settled: 98,
            rejected: 2,
            lost: 0,
            throughput_per_s: 99.5,
            latency_ms: latencies.summary(),
            conflicting: 1,
        };
        let json = serde_json::to_string(&report).expect("json");
        assert!(!json.contains("conflicting"), "only the contract's keys: {json}");
        assert!(!report.is_clean(), "two outcomes for one transfer fail the run");
        assert!(Report { conflicting: 0, ..report.clone() }.is_clean());
        assert!(
            json.starts_with(r#"{"sent":100,"accepted":100,"settled":98,"rejected":2,"lost":0,"throughput_per_s":99.5,"latency_ms":{"p50":"#),
            "{json}"
        );
        let summary = report.latency_ms;
        assert!((summary.p50 - 50.0).abs() < 0.1, "{summary:?}");
        assert!((summary.p99 - 99.0).abs() < 0.1, "{summary:?}");
        assert!((summary.max - 100.0).abs() < 0.1, "{summary:?}");
    }

    #[test]
    fn an_empty_histogram_reports_zeros_and_huge_values_are_clamped() {
        assert_eq!(Latencies::default().summary(), LatencySummary { p50: 0.0, p95: 0.0, p99: 0.0, max: 0.0 });
        let mut latencies = Latencies::default();
        latencies.record(Duration::from_secs(10_000));
        latencies.record(Duration::ZERO);
        assert_eq!(latencies.len(), 2);
        assert!(latencies.summary().max >= 3_599_000.0);
    }
}
