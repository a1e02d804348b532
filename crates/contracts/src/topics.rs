//! Topic and consumer-group names, and the plan of every topic the system owns
//! (`docs/reference/contract.md` §3, *Topics*).
//!
//! Names can carry a prefix (empty in production) so that tests on one shared broker get topics
//! of their own; everything else derives from the four event topics.

/// `transferencias.solicitada`, keyed by `contaOrigem`, written by the transfers outbox.
pub const REQUESTED: &str = "transferencias.solicitada";
/// `transferencias.analisada`, written by antifraud inside Kafka transactions.
pub const ANALYSED: &str = "transferencias.analisada";
/// `transferencias.rejeitada`, written by antifraud and by the ledger's outbox.
pub const REJECTED: &str = "transferencias.rejeitada";
/// `transferencias.liquidada`, written by the ledger's outbox.
pub const SETTLED: &str = "transferencias.liquidada";

/// The four event topics, in pipeline order.
pub const EVENT_TOPICS: [&str; 4] = [REQUESTED, ANALYSED, REJECTED, SETTLED];

/// Suffix of a dead-letter topic: `<topic>-dlt`.
pub const DEAD_LETTER_SUFFIX: &str = "-dlt";
/// Delays of the notification retry topics, `<topic>-retry-<ms>`: 4 attempts in all.
pub const RETRY_DELAYS_MS: [u32; 3] = [1000, 2000, 4000];
/// The topics notifications consume and that therefore get retry topics.
pub const RETRIED_TOPICS: [&str; 2] = [SETTLED, REJECTED];

/// Retention of event and retry topics: 7 days.
pub const EVENT_RETENTION_MS: i64 = 7 * 24 * 60 * 60 * 1000;
/// Retention of dead-letter topics: 30 days, time for an operator to look.
pub const DEAD_LETTER_RETENTION_MS: i64 = 30 * 24 * 60 * 60 * 1000;

/// Consumer group ids.
pub mod groups {
    pub const ANTIFRAUD: &str = "antifraude";
    pub const LEDGER: &str = "ledger";
    pub const TRANSFERS_PROJECTION: &str = "transferencias-projecao";
    pub const NOTIFICATIONS: &str = "notificacoes";

    /// `notificacoes-retry-<ms>`, as Spring suffixes the group of each retry topic.
    pub fn notifications_retry(delay_ms: u32) -> String {
        format!("{NOTIFICATIONS}-retry-{delay_ms}")
    }
}

/// `<topic>-dlt`.
pub fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}{DEAD_LETTER_SUFFIX}")
}

/// `<topic>-retry-<delay_ms>`.
pub fn retry_topic(topic: &str, delay_ms: u32) -> String {
    format!("{topic}-retry-{delay_ms}")
}

/// What a topic is for; decides its retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicKind {
    Event,
    Retry { source: String, delay_ms: u32 },
    DeadLetter { source: String },
}

/// One topic of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub kind: TopicKind,
    pub retention_ms: i64,
}

/// Every topic the system owns, each name behind `prefix` (empty in production): the four event
/// topics, a `-dlt` for each consumed topic, and the three retry topics of each notified topic.
pub fn plan(prefix: &str) -> Vec<TopicSpec> {
    let mut specs = Vec::new();
    for topic in EVENT_TOPICS {
        specs.push(TopicSpec {
            name: format!("{prefix}{topic}"),
            kind: TopicKind::Event,
            retention_ms: EVENT_RETENTION_MS,
        });
    }
    for topic in RETRIED_TOPICS {
        for delay_ms in RETRY_DELAYS_MS {
            specs.push(TopicSpec {
                name: retry_topic(&format!("{prefix}{topic}"), delay_ms),
                kind: TopicKind::Retry { source: format!("{prefix}{topic}"), delay_ms },
                retention_ms: EVENT_RETENTION_MS,
            });
        }
    }
    // every event topic has a consumer, so every one gets a dead-letter topic
    for topic in EVENT_TOPICS {
        specs.push(TopicSpec {
            name: dead_letter_topic(&format!("{prefix}{topic}")),
            kind: TopicKind::DeadLetter { source: format!("{prefix}{topic}") },
            retention_ms: DEAD_LETTER_RETENTION_MS,
        });
    }
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_every_contract_topic() {
        let names: Vec<String> = plan("").into_iter().map(|spec| spec.name).collect();
        for expected in [
            "transferencias.solicitada",
            "transferencias.analisada",
            "transferencias.rejeitada",
            "transferencias.liquidada",
            "transferencias.solicitada-dlt",
            "transferencias.analisada-dlt",
            "transferencias.rejeitada-dlt",
            "transferencias.liquidada-dlt",
            "transferencias.liquidada-retry-1000",
            "transferencias.liquidada-retry-2000",
            "transferencias.liquidada-retry-4000",
            "transferencias.rejeitada-retry-1000",
            "transferencias.rejeitada-retry-2000",
            "transferencias.rejeitada-retry-4000",
        ] {
            assert!(names.iter().any(|name| name == expected), "missing {expected}");
        }
        assert_eq!(names.len(), 14);
    }

    #[test]
    fn dead_letters_keep_thirty_days_and_the_rest_seven() {
        for spec in plan("t1.") {
            assert!(spec.name.starts_with("t1.transferencias."), "{}", spec.name);
            match spec.kind {
                TopicKind::DeadLetter { .. } => assert_eq!(spec.retention_ms, 2_592_000_000),
                _ => assert_eq!(spec.retention_ms, 604_800_000),
            }
        }
    }

    #[test]
    fn retry_group_names() {
        assert_eq!(groups::notifications_retry(1000), "notificacoes-retry-1000");
        assert_eq!(retry_topic(SETTLED, 4000), "transferencias.liquidada-retry-4000");
        assert_eq!(dead_letter_topic(ANALYSED), "transferencias.analisada-dlt");
    }
}
