//! Counters that alerts read, exported at 0 from the start: Prometheus' `increase()` and
//! `rate()` need a sample before the first event, or the first dead letter of a process would
//! never raise `DeadLettersArriving` (a series that appears at 1 has no increase).

use contracts::topics::dead_letter_topic;

/// Registers `retries_total{topic}` for every topic in `retried` and `dlt_mensagens_total{topic}`
/// for the `-dlt` topic of every topic in `dead_lettered`, at 0 (or as they are).
pub fn export_at_zero(retried: &[String], dead_lettered: &[String]) {
    for topic in retried {
        metrics::counter!("retries_total", "topic" => topic.clone()).increment(0);
    }
    for topic in dead_lettered {
        metrics::counter!("dlt_mensagens_total", "topic" => dead_letter_topic(topic)).increment(0);
    }
}
