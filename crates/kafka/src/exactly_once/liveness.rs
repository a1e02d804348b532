//! Whether the exactly-once loop is making progress, for `/readyz`, a gauge and an alert: an
//! exactly-once loop that cannot commit (an offset commit left open in `__consumer_offsets`, a
//! refused write, a broker it cannot reach) holds every payment behind it, and must say so.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Since when the loop has failed without committing, and why: shared between the loop, which
/// reports, and a [`telemetry::health::ReadinessCheck`], which reads.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    state: Arc<Mutex<Failing>>,
}

#[derive(Debug, Default)]
struct Failing {
    since: Option<Instant>,
    last_error: String,
}

impl Liveness {
    fn lock(&self) -> std::sync::MutexGuard<'_, Failing> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A step failed (a discarded batch, a producer not registered, a rewind that could not
    /// read the committed offsets); `group`'s `kafka_transaction_failing_seconds` says since when.
    pub(super) fn failed(&self, group: &str, error: String) {
        let mut failing = self.lock();
        let since = *failing.since.get_or_insert_with(Instant::now);
        failing.last_error = error;
        metrics::gauge!("kafka_transaction_failing_seconds", "group" => group.to_owned())
            .set(since.elapsed().as_secs_f64());
    }

    /// A transaction committed: whatever failed before is over.
    pub(super) fn committed(&self, group: &str) {
        let mut failing = self.lock();
        if failing.since.take().is_some() {
            failing.last_error.clear();
            metrics::gauge!("kafka_transaction_failing_seconds", "group" => group.to_owned()).set(0.0);
        }
    }

    /// How long the loop has been failing without a commit, and the last error; `None` while
    /// it is not failing.
    pub fn failing(&self) -> Option<(Duration, String)> {
        let failing = self.lock();
        failing.since.map(|since| (since.elapsed(), failing.last_error.clone()))
    }
}

/// `/readyz` fails while the loop has been failing for longer than `bound` without a commit,
/// naming the last error: no payment passes that hop meanwhile.
#[derive(Debug, Clone)]
pub struct Stalled {
    pub liveness: Liveness,
    pub bound: Duration,
}

impl telemetry::health::ReadinessCheck for Stalled {
    fn name(&self) -> &'static str {
        "exactly-once"
    }

    fn check(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>> {
        let failing = self.liveness.failing();
        let bound = self.bound;
        Box::pin(async move {
            match failing {
                Some((for_, error)) if for_ > bound => {
                    Err(format!("no transaction committed for {}s, failing since: {error}", for_.as_secs()))
                }
                _ => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readiness_fails_only_after_the_bound_and_recovers_at_a_commit() {
        use telemetry::health::ReadinessCheck;
        let liveness = Liveness::default();
        let stalled = Stalled { liveness: liveness.clone(), bound: Duration::ZERO };
        assert_eq!(stalled.check().await, Ok(()));
        liveness.failed("g", "UNSTABLE_OFFSET_COMMIT on in/0".into());
        let error = stalled.check().await.expect_err("failing past the bound");
        assert!(error.contains("UNSTABLE_OFFSET_COMMIT on in/0"), "{error}");
        let patient = Stalled { liveness: liveness.clone(), bound: Duration::from_secs(3600) };
        assert_eq!(patient.check().await, Ok(()), "within the bound");
        liveness.committed("g");
        assert_eq!(stalled.check().await, Ok(()));
        assert!(liveness.failing().is_none());
    }
}
