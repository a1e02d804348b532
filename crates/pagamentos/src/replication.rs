//! The replication floor: topics with fewer than 3 replicas lose acknowledged events when one
//! broker's disk fails, and an event lost before a stage consumed it leaves its transfer
//! `PENDENTE`. The contract keeps `APP_KAFKA_REPLICAS` at default 1 (a single-broker
//! development stack) and asks 3 in production, so the commands that create topics (the
//! services and `pagamentos topics`) refuse a factor below 3 unless it is asked for explicitly
//! with `--allow-under-replicated`, and then say so in a warning at start.

use kafka::TopicArgs;

/// The replication factor production needs: one broker lost, writes go on with two in sync.
pub const PRODUCTION_REPLICAS: i32 = 3;

#[derive(Debug, Clone, clap::Args)]
pub struct ReplicationArgs {
    /// Accept a replication factor (`APP_KAFKA_REPLICAS`) below 3: a single-broker development
    /// stack or tests. Without it, fewer than 3 replicas is refused; with it, a warning is
    /// logged at start. Production: 3 replicas and leave this off.
    #[arg(
        long,
        env = "PAGAMENTOS_ALLOW_UNDER_REPLICATED",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub allow_under_replicated: bool,
}

/// Refused: too few replicas without the opt-in.
#[derive(Debug, thiserror::Error)]
#[error(
    "APP_KAFKA_REPLICAS is {0}: topics with fewer than {PRODUCTION_REPLICAS} replicas lose acknowledged \
     events when one broker's disk fails. Set APP_KAFKA_REPLICAS={PRODUCTION_REPLICAS} (production), or \
     pass --allow-under-replicated (PAGAMENTOS_ALLOW_UNDER_REPLICATED=true) on a single-broker \
     development stack"
)]
pub struct UnderReplicated(pub i32);

impl ReplicationArgs {
    /// `Err` for fewer than 3 replicas without the opt-in; with it, a warning.
    pub fn check(&self, topics: &TopicArgs) -> Result<(), UnderReplicated> {
        if topics.replicas >= PRODUCTION_REPLICAS {
            return Ok(());
        }
        if !self.allow_under_replicated {
            return Err(UnderReplicated(topics.replicas));
        }
        tracing::warn!(
            replicas = topics.replicas,
            "topics with fewer than {PRODUCTION_REPLICAS} replicas (--allow-under-replicated): one broker's \
             disk lost can lose acknowledged events; development only"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(replicas: i32) -> TopicArgs {
        TopicArgs { partitions: 12, replicas }
    }

    #[test]
    fn fewer_than_three_replicas_need_the_opt_in() {
        let refuse = ReplicationArgs { allow_under_replicated: false };
        let allow = ReplicationArgs { allow_under_replicated: true };
        for replicas in [1, 2] {
            let error = refuse.check(&topics(replicas)).expect_err("refused");
            assert!(error.to_string().starts_with(&format!("APP_KAFKA_REPLICAS is {replicas}:")), "{error}");
            assert!(allow.check(&topics(replicas)).is_ok());
        }
        for replicas in [3, 5] {
            assert!(refuse.check(&topics(replicas)).is_ok());
        }
    }
}
