//! The monitoring files under `deploy/grafana/` stay in step with the code: every metric a
//! dashboard panel or an alert queries is one the services emit.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The checkout, found at run time (a test binary may be shared by several clones).
fn checkout() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
    PathBuf::from(package).join("../..")
}

/// Every metric name the services' sources register with the `metrics` macros.
fn emitted_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let crates = checkout().join("crates");
    let mut stack = vec![crates];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "tests" && name != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).expect("read source");
                for macro_name in ["counter!(", "gauge!(", "histogram!("] {
                    for (index, _) in text.match_indices(macro_name) {
                        let rest = text[index + macro_name.len()..].trim_start();
                        if let Some(quoted) = rest.strip_prefix('"') {
                            if let Some(end) = quoted.find('"') {
                                names.insert(quoted[..end].to_owned());
                            }
                        }
                    }
                }
            }
        }
    }
    names
}

/// Metric names in a PromQL expression: identifiers directly followed by `{`, `[` or `)` that
/// look like ours (`_total`, `_seconds`, `_bucket`, or a known name).
fn queried_metrics(expr: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = expr.as_bytes();
    let mut start = None;
    for (index, &byte) in bytes.iter().chain(std::iter::once(&b' ')).enumerate() {
        let word = byte.is_ascii_alphanumeric() || byte == b'_';
        match (word, start) {
            (true, None) => start = Some(index),
            (false, Some(from)) => {
                let ident = &expr[from..index];
                let next = expr[index..].trim_start().chars().next();
                let metric_like = ident.contains('_')
                    && ident.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                    && matches!(next, Some('{') | Some('[') | Some(')') | None | Some(' ') | Some('>'));
                let keyword =
                    ["histogram_quantile", "by", "sum", "rate", "increase", "max", "topk", "deriv", "and"]
                        .contains(&ident);
                if metric_like && !keyword && !ident.starts_with("le") {
                    let base = ident.strip_suffix("_bucket").unwrap_or(ident);
                    if known.contains(base)
                        || ident.ends_with("_total")
                        || ident.ends_with("_seconds")
                        || ident.ends_with("_bucket")
                        || ident.contains("kafka_")
                        || ident.contains("outbox_")
                        || ident.contains("dlt_")
                    {
                        found.push(base.to_owned());
                    }
                }
                start = None;
            }
            _ => {}
        }
    }
    found
}

#[test]
fn the_dashboard_and_the_alerts_query_only_emitted_metrics() {
    let emitted = emitted_metrics();
    for expected in ["kafka_consumer_lag", "http_server_request_duration_seconds", "transferencias_total"] {
        assert!(emitted.contains(expected), "{expected} not found in the sources: {emitted:?}");
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(checkout().join("deploy/grafana/pagamentos.json")).expect("dashboard"),
    )
    .expect("dashboard is JSON");
    let mut queried = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queried.extend(queried_metrics(target["expr"].as_str().expect("expr"), &emitted));
        }
    }
    let alerts = std::fs::read_to_string(checkout().join("deploy/grafana/alerts.yml")).expect("alerts");
    for line in alerts.lines().filter_map(|line| line.trim().strip_prefix("expr:")) {
        queried.extend(queried_metrics(line, &emitted));
    }
    assert!(queried.len() >= 15, "the dashboard and alerts query metrics: {queried:?}");
    let unknown: BTreeSet<&String> = queried.iter().filter(|name| !emitted.contains(*name)).collect();
    assert!(unknown.is_empty(), "queried but never emitted: {unknown:?}");
    // and every contract metric has a panel
    for contract in [
        "outbox_pendentes",
        "outbox_oldest_pending_seconds",
        "kafka_consumer_lag",
        "dlt_mensagens_total",
        "dlt_mensagens_retidas",
        "retries_total",
        "transferencias_total",
        "http_server_request_duration_seconds",
    ] {
        assert!(queried.iter().any(|name| name == contract), "no panel for {contract}");
    }
}

#[test]
fn the_expression_reader_finds_metric_names() {
    let known: BTreeSet<String> = ["outbox_pendentes".to_owned()].into();
    assert_eq!(
        queried_metrics("histogram_quantile(0.99, sum by (le, route) (rate(http_server_request_duration_seconds_bucket[5m])))", &known),
        vec!["http_server_request_duration_seconds"]
    );
    assert_eq!(queried_metrics("max by (database) (outbox_pendentes) > 0", &known), vec!["outbox_pendentes"]);
    assert_eq!(
        queried_metrics("sum by (topic) (increase(nao_existe_total[5m]))", &known),
        vec!["nao_existe_total"]
    );
}

/// The topics the Helm chart's KafkaTopics are made from (`deploy/helm/pagamentos/files/
/// kafka-plan.yaml`, one `- {name: …, retentionMs: …}` line each): exactly the contract's topic
/// plan, with its retention. scripts/chart-check then checks the rendered KafkaTopics against
/// that file (partitions, replication and `min.insync.replicas` from the values).
#[test]
fn the_helm_charts_topics_are_the_contracts() {
    let plan = std::fs::read_to_string(checkout().join("deploy/helm/pagamentos/files/kafka-plan.yaml"))
        .expect("deploy/helm/pagamentos/files/kafka-plan.yaml");
    let mut chart: Vec<(String, i64)> = Vec::new();
    for line in plan.lines().map(str::trim).filter(|line| line.starts_with("- {name: ")) {
        let fields: std::collections::BTreeMap<&str, &str> = line
            .trim_start_matches("- {")
            .trim_end_matches('}')
            .split(',')
            .filter_map(|field| field.split_once(':'))
            .map(|(key, value)| (key.trim(), value.trim()))
            .collect();
        if let (Some(name), Some(retention)) = (fields.get("name"), fields.get("retentionMs")) {
            chart.push(((*name).to_owned(), retention.parse().expect("retentionMs is an integer")));
        }
    }
    let mut contract: Vec<(String, i64)> =
        contracts::topics::plan("").into_iter().map(|spec| (spec.name, spec.retention_ms)).collect();
    chart.sort();
    contract.sort();
    assert_eq!(contract.len(), 14, "the contract's plan: {contract:?}");
    assert_eq!(
        chart, contract,
        "the chart's topics (left: kafka-plan.yaml) differ from crates/contracts' plan"
    );
}
