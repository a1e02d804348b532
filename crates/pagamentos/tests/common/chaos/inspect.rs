//! What the checks read after the run: every record of some topics, and where lost transfers
//! stopped.

use std::collections::HashMap;
use std::time::Duration;

use kafka::rdkafka::message::Message;
use serde_json::{json, Value};

use crate::common::system::System;

/// Every record on `topics` (read_committed), read to the end of every partition (librdkafka's
/// partition EOF, which under read_committed is the last stable offset), once both outboxes
/// have published everything: its payload, plus where it was (`_at`: topic/partition/offset).
/// No quiet time window decides that the reading is over.
pub async fn read_all(system: &System, topics: &[String]) -> Vec<Value> {
    const UNPUBLISHED: &str = "SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL";
    testkit::eventually("both outboxes published", Duration::from_secs(120), || async {
        let mut left = 0i64;
        for pool in [&system.transfers_db.pool, &system.ledger_db.pool] {
            left += sqlx::query_scalar::<_, i64>(UNPUBLISHED).fetch_one(pool).await.ok()?;
        }
        (left == 0).then_some(())
    })
    .await;
    let mut records = Vec::new();
    for topic in topics {
        for record in testkit::read_to_end(&system.topics.args, topic).await {
            let payload = record.payload().unwrap_or_default();
            let mut value: Value = serde_json::from_slice(payload)
                .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(payload)}));
            value["_at"] = json!(format!("{}/{}/{}", record.topic(), record.partition(), record.offset()));
            records.push(value);
        }
    }
    records
}

/// Where the lost transfers stopped: published by the relay? analysed? decided by the ledger?
/// its outcome published?
pub async fn diagnose(
    system: &System,
    lost: &[&String],
    analysed: &HashMap<String, usize>,
    requests: &[Value],
) {
    // the topics stay for a post-mortem with the broker's tools, whatever the test does next
    system.keep(&format!("{} accepted transfers lost", lost.len()));
    // (this runs on the failure path: nothing in it panics, a failure is a printed line)
    let ids: Vec<uuid::Uuid> = lost.iter().filter_map(|id| id.parse().ok()).collect();
    async fn count(pool: &sqlx::PgPool, sql: &str, ids: &[uuid::Uuid]) -> String {
        match sqlx::query_scalar::<_, i64>(sql).bind(ids).fetch_one(pool).await {
            Ok(count) => count.to_string(),
            Err(error) => format!("? ({error})"),
        }
    }
    const UNPUBLISHED: &str = "SELECT count(*) FROM outbox_evento \
        WHERE publicado_em IS NULL AND (payload::jsonb->>'transferenciaId')::uuid = ANY($1)";
    let unpublished = count(&system.transfers_db.pool, UNPUBLISHED, &ids).await;
    let decided = count(
        &system.ledger_db.pool,
        "SELECT count(*) FROM transferencia_processada WHERE transferencia_id = ANY($1)",
        &ids,
    )
    .await;
    let outcome_unpublished = count(&system.ledger_db.pool, UNPUBLISHED, &ids).await;
    let was_analysed = lost.iter().filter(|id| analysed.contains_key(**id)).count();
    eprintln!(
        "[chaos] {} lost: request unpublished {unpublished}, analysed {was_analysed}, decided by the ledger {decided}, \
         outcome unpublished {outcome_unpublished}; first: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    unanalysed_requests(system, lost, analysed, requests).await;
    let outcomes = [
        system.topics.topic(contracts::topics::ANALYSED),
        system.topics.topic(contracts::topics::REJECTED),
        system.topics.topic(contracts::topics::SETTLED),
    ];
    for topic in &outcomes {
        open_transactions(system, topic, lost).await;
    }
}

/// A read_committed reader (the checks, the ledger, the projection) stops at a partition's
/// last stable offset: a transaction still open there hides every record after it, committed
/// or not. Says where a partition of `topic` has one, and which of the `lost` transfers have a
/// record on `topic` that only a read_uncommitted reader sees (in a transaction still open, or
/// aborted): an outcome written but hidden, rather than never written.
async fn open_transactions(system: &System, topic: &str, lost: &[&String]) {
    let args = &system.topics.args;
    let patience = Duration::from_secs(10);
    let (stable, high) = match (
        testkit::partition_ends(args, topic, "read_committed", patience).await,
        testkit::partition_ends(args, topic, "read_uncommitted", patience).await,
    ) {
        (Ok(stable), Ok(high)) => (stable, high),
        other => {
            eprintln!("[chaos] {topic}: ends unreadable: {other:?}");
            return;
        }
    };
    for ((partition, stable), (_, high)) in stable.iter().zip(&high) {
        if stable < high {
            eprintln!(
                "[chaos] {topic}/{partition}: last stable offset {stable} < high watermark {high}: a transaction open there hides what follows from read_committed readers"
            );
        }
    }
    // (a minute for each record or end at most: this is only a diagnosis)
    let records = match testkit::read_to_end_as(
        &system.topics.args,
        topic,
        "read_uncommitted",
        Duration::from_secs(60),
    )
    .await
    {
        Ok(records) => records,
        Err(error) => {
            eprintln!("[chaos] {topic}: read_uncommitted reading failed: {error}");
            return;
        }
    };
    let mut found = 0usize;
    for record in &records {
        let text = String::from_utf8_lossy(record.payload().unwrap_or_default());
        if let Some(id) = lost.iter().find(|id| text.contains(id.as_str())) {
            found += 1;
            eprintln!(
                "[chaos] lost {id}: a record on {topic}/{}/{} (seen read_uncommitted; read_committed readers see it only if its transaction committed)",
                record.partition(),
                record.offset()
            );
        }
    }
    if found == 0 {
        eprintln!("[chaos] {topic}: none of the lost transfers has a record there, committed or not");
    }
}

/// For lost transfers antifraude never analysed: where their request records are, the
/// antifraude group's committed offset on those partitions, and which neighbouring requests
/// were analysed (a skipped run of offsets points at a batch whose offsets were committed
/// without its outputs; a single hole at something else); then, from the broker's own logs
/// ([`super::dump`]), the transactional commit that passed each one, the range of offsets it
/// claims and what its transaction wrote on the output topics.
// Over 100 lines on purpose: one diagnosis, top to bottom: where the lost transfers' records are,
// the group's committed offsets there and what the broker's logs say, each step reading what the
// last found.
async fn unanalysed_requests(
    system: &System,
    lost: &[&String],
    analysed: &HashMap<String, usize>,
    requests: &[Value],
) {
    let at = |request: &Value| -> Option<(i32, i64)> {
        let text = request["_at"].as_str()?;
        let mut parts = text.rsplitn(3, '/');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        Some((partition, offset))
    };
    let topic = system.topics.topic(contracts::topics::REQUESTED);
    let mut partitions = std::collections::BTreeSet::new();
    let mut unanalysed = Vec::new();
    for id in lost.iter().filter(|id| !analysed.contains_key(id.as_str())) {
        for request in requests.iter().filter(|request| request["transferenciaId"] == id.as_str()) {
            let Some((partition, offset)) = at(request) else { continue };
            partitions.insert(partition);
            unanalysed.push((id.as_str(), partition, offset));
            let neighbours: Vec<String> = requests
                .iter()
                .filter_map(|other| {
                    let (p, o) = at(other)?;
                    let transfer = other["transferenciaId"].as_str()?;
                    (p == partition && (o - offset).abs() <= 6).then(|| {
                        format!("{o}:{}", if analysed.contains_key(transfer) { "analysed" } else { "NOT" })
                    })
                })
                .collect();
            eprintln!(
                "[chaos] unanalysed {id}: request at {topic}/{partition}/{offset}; neighbours {neighbours:?}"
            );
        }
    }
    let group = system.topics.args.group(contracts::topics::groups::ANTIFRAUD);
    let config = kafka::config::consumer_config(
        &system.topics.args,
        "chaos-diagnose",
        &group,
        kafka::config::OffsetCommit::StoredAfterHandling,
    );
    let Ok(consumer) = config.create::<kafka::rdkafka::consumer::BaseConsumer>() else {
        eprintln!("[chaos] no consumer to read {group}'s committed offsets");
        return;
    };
    let mut list = kafka::rdkafka::TopicPartitionList::new();
    for partition in &partitions {
        list.add_partition(&topic, *partition);
    }
    match kafka::rdkafka::consumer::Consumer::committed_offsets(&consumer, list, Duration::from_secs(10)) {
        Ok(committed) => eprintln!("[chaos] {group} committed on {topic}: {committed:?}"),
        Err(error) => eprintln!("[chaos] {group}'s committed offsets unreadable: {error}"),
    }
    drop(consumer);
    if unanalysed.is_empty() {
        return;
    }
    let outputs =
        [system.topics.topic(contracts::topics::ANALYSED), system.topics.topic(contracts::topics::REJECTED)];
    let evidence = super::dump::Evidence::gather(&system.topics.args.bootstrap_servers, &outputs).await;
    for note in &evidence.notes {
        eprintln!("[chaos] broker logs: {note}");
    }
    for (id, partition, offset) in unanalysed {
        let passing = match evidence.passing(&group, &topic, partition, offset) {
            Ok(passing) => passing,
            Err(error) => {
                eprintln!("[chaos] lost {id} (request at {topic}/{partition}/{offset}): {error}");
                continue;
            }
        };
        for line in passing.report(Some(id)) {
            eprintln!("[chaos] lost {id}: {line}");
        }
        // the requests in the range the commit claims, and which of them it wrote an output for
        let (Some(from), Some(to)) = (passing.previous, passing.commit.offset) else { continue };
        let written: std::collections::HashSet<String> = passing
            .outputs
            .iter()
            .flat_map(|(_, _, written)| written.iter().filter_map(|record| record.transfer()))
            .collect();
        let claimed: Vec<String> = requests
            .iter()
            .filter_map(|request| {
                let (p, o) = at(request)?;
                let transfer = request["transferenciaId"].as_str()?;
                (p == partition && from <= o && o < to).then(|| {
                    let how = match (written.contains(transfer), analysed.contains_key(transfer)) {
                        (true, _) => "in this transaction",
                        (false, true) => "analysed elsewhere",
                        (false, false) => "NEVER analysed",
                    };
                    format!("{o}:{transfer}:{how}")
                })
            })
            .collect();
        eprintln!(
            "[chaos] lost {id}: the {} request(s) in [{from}, {to}) on {topic}/{partition}: {claimed:?}",
            claimed.len()
        );
    }
}
