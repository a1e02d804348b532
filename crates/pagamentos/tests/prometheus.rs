//! The monitoring files under `deploy/grafana/` checked by a real Prometheus (Debian's
//! `prometheus` package, which brings `promtool`; `scripts/test` installs it): the alert rules
//! and the scrape configuration pass `promtool check`, the alert unit tests in `alerts_test.yml`
//! pass `promtool test rules` and cover every alert firing and staying silent; and a Prometheus
//! of the test's own, scraping `pagamentos all` through traffic with a dead letter, answers every
//! query of the dashboard `pagamentos.json` with data and holds `DeadLettersWaiting` active.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use common::system::{free_port, System};

/// The checkout, found at run time (a test binary may be shared by several clones).
fn checkout() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
    PathBuf::from(package).join("../..")
}

fn grafana(file: &str) -> PathBuf {
    checkout().join("deploy/grafana").join(file)
}

/// `name` on `PATH`, or a panic telling how to get it: these tests do not skip.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found on PATH: install Debian's `prometheus` package \
                 (apt-get install prometheus; scripts/test installs it), which brings \
                 prometheus and promtool"
            )
        })
}

/// Runs `promtool args…`; panics with its output unless it succeeds.
fn promtool(args: &[&Path]) -> String {
    let output = Command::new(tool("promtool")).args(args).output().expect("run promtool");
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?} failed ({}):\n{text}", output.status);
    text
}

/// The alert names `alerts.yml` defines (`- alert: Name` lines).
fn alert_names() -> Vec<String> {
    let rules = std::fs::read_to_string(grafana("alerts.yml")).expect("read alerts.yml");
    rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect()
}

#[test]
fn the_alert_rules_and_the_scrape_config_pass_promtool() {
    let names = alert_names();
    let checked = promtool(&[Path::new("check"), Path::new("rules"), &grafana("alerts.yml")]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", names.len())), "{checked}");
    promtool(&[Path::new("check"), Path::new("config"), &grafana("prometheus.yml")]);
    let tested = promtool(&[Path::new("test"), Path::new("rules"), &grafana("alerts_test.yml")]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every alert of `alerts.yml` has a unit test where it fires and one where it stays silent
/// (`exp_alerts: []`), so a new alert without tests, or a test that only ever expects silence,
/// fails here.
#[test]
fn every_alert_has_unit_tests_firing_and_silent() {
    let names = alert_names();
    assert!(names.contains(&"DeadLettersWaiting".to_owned()), "{names:?}");
    let tests = std::fs::read_to_string(grafana("alerts_test.yml")).expect("read alerts_test.yml");
    // (alert name, expects silence) for each `alertname:` followed by its `exp_alerts:`
    let mut cases = Vec::new();
    let mut lines = tests.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#'));
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("alertname:") {
            let expected = lines.next().unwrap_or_default();
            let silent = match expected.strip_prefix("exp_alerts:").map(str::trim) {
                Some("[]") => true,
                Some("") => false,
                _ => panic!("alertname {name} is not followed by exp_alerts: {expected:?}"),
            };
            cases.push((name.trim().to_owned(), silent));
        }
    }
    for name in &names {
        for (silent, what) in [(false, "fires"), (true, "stays silent")] {
            assert!(
                cases.contains(&(name.clone(), silent)),
                "deploy/grafana/alerts_test.yml has no case where {name} {what}; cases: {cases:?}"
            );
        }
    }
    let unknown: Vec<&(String, bool)> = cases.iter().filter(|(name, _)| !names.contains(name)).collect();
    assert!(unknown.is_empty(), "unit tests of alerts that alerts.yml does not define: {unknown:?}");
}

/// A Prometheus process of the test's own: the shipped `deploy/grafana/prometheus.yml` and
/// `alerts.yml` copied into a temporary directory, scraping `target` every second and
/// evaluating the rules every second, its data in that directory, its API on a free port;
/// killed and removed when dropped.
struct Prometheus {
    child: tokio::process::Child,
    dir: PathBuf,
    url: String,
    http: reqwest::Client,
}

impl Prometheus {
    async fn start(target: &str) -> Self {
        let dir = std::env::temp_dir().join(testkit::unique("prometheus"));
        std::fs::create_dir_all(&dir).expect("create the Prometheus directory");
        let shipped = std::fs::read_to_string(grafana("prometheus.yml")).expect("read prometheus.yml");
        let mut config = shipped.clone();
        for (from, to) in [
            ("scrape_interval: 5s", "scrape_interval: 1s".to_owned()),
            ("evaluation_interval: 15s", "evaluation_interval: 1s".to_owned()),
            ("\"localhost:8080\"", format!("\"{target}\"")),
        ] {
            assert!(
                config.contains(from),
                "deploy/grafana/prometheus.yml no longer has {from:?}: adjust this test"
            );
            config = config.replacen(from, &to, 1);
        }
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        std::fs::copy(grafana("alerts.yml"), dir.join("alerts.yml")).expect("copy alerts.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = tokio::process::Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus");
        let mut prometheus =
            Self { child, dir, url: format!("http://127.0.0.1:{port}"), http: reqwest::Client::new() };
        let ready = format!("{}/-/ready", prometheus.url);
        prometheus
            .wait("Prometheus ready", Duration::from_secs(60), || async {
                let response = prometheus.http.get(&ready).send().await.map_err(|error| error.to_string())?;
                response.status().is_success().then_some(()).ok_or_else(|| response.status().to_string())
            })
            .await;
        if let Ok(Some(status)) = prometheus.child.try_wait() {
            panic!("prometheus exited with {status}:\n{}", prometheus.log());
        }
        prometheus
    }

    /// The last 40 lines of Prometheus' log.
    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `data` of an API answer at `path` (`/api/v1/…`) with `params`.
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.url), params)
            .map_err(|error| error.to_string())?;
        let body: Value = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|error| error.to_string())?
            .json()
            .await
            .map_err(|error| error.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{path} {params:?}: {body}"));
        }
        Ok(body["data"].clone())
    }

    /// The instant vector `expr` evaluates to now.
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Polls `condition` every 250 ms until it is `Ok`; after `timeout`, panics with `what`, the
    /// last error and Prometheus' log.
    async fn wait<T, F, Fut>(&self, what: &str, timeout: Duration, mut condition: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match condition().await {
                Ok(value) => return value,
                Err(last) if tokio::time::Instant::now() > deadline => {
                    panic!(
                        "timed out after {timeout:?} waiting for {what}: {last}\nprometheus log (tail):\n{}",
                        self.log()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every `expr` in the dashboard (panels nest in rows), with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    fn walk(value: &Value, title: &str, found: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
                for (key, inner) in map {
                    match (key.as_str(), inner) {
                        ("expr", Value::String(expr)) => found.push((title.to_owned(), expr.clone())),
                        _ => walk(inner, title, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, title, found)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(grafana("pagamentos.json")).expect("read pagamentos.json");
    let dashboard: Value = serde_json::from_str(&text).expect("pagamentos.json is JSON");
    let mut found = Vec::new();
    walk(&dashboard["panels"], "", &mut found);
    found
}

/// `expr` with Grafana's template variables replaced as Grafana would for a 1 s scrape
/// interval; a variable this does not know fails the test, naming it.
fn substitute_variables(expr: &str) -> String {
    let mut expr = expr.to_owned();
    for (variable, value) in
        [("$__rate_interval", "1m"), ("${__rate_interval}", "1m"), ("$__interval", "1s"), ("$__range", "5m")]
    {
        expr = expr.replace(variable, value);
    }
    assert!(!expr.contains('$'), "a template variable this test does not substitute: {expr}");
    expr
}

/// True when a result has a number to plot (a quantile over no observations is NaN).
fn plottable(series: &Value) -> bool {
    series["value"][1].as_str().and_then(|value| value.parse::<f64>().ok()).is_some_and(f64::is_finite)
}

// Over 100 lines on purpose: one scenario on one running system, read top to bottom; its steps
// build on each other's state, so splitting it would only pass that state around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_answers_every_dashboard_query_and_holds_dead_letters_waiting() {
    use kafka::producer::{OutgoingRecord, Producer};
    use kafka::rdkafka::message::Message;
    use testkit::webhook::Receiver;

    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "the dashboard's queries: {queries:?}");
    // fail fast, before the system starts, on a variable the test cannot fill in
    let queries: Vec<(String, String)> =
        queries.into_iter().map(|(title, expr)| (title, substitute_variables(&expr))).collect();

    let system = System::new().await;
    let (receiver, webhook) = Receiver::start().await;
    let _all = system.start_with(&[("NOTIFICACOES_WEBHOOK_URL", webhook.as_str())]).await;
    system.open_account("PROM-A", 100_000_000).await;
    system.open_account("PROM-B", 0).await;
    let prometheus = Prometheus::start(&format!("127.0.0.1:{}", system.ports[0])).await;

    // traffic until the end of the test, a few transfers a second: settlements, antifraud blocks
    // and short balances, so every rate and latency panel has observations in its window
    let traffic = {
        let http = system.http.clone();
        let url = system.api("/transferencias");
        tokio::spawn(async move {
            for n in 0u64.. {
                let (from, to, cents) = match n % 3 {
                    0 => ("PROM-A", "PROM-B", 100),
                    1 => ("PROM-A", "PROM-B", 15_000_000),
                    _ => ("PROM-B", "PROM-A", 5_000_000),
                };
                let body = json!({"contaOrigem": from, "contaDestino": to, "valorEmCentavos": cents, "moeda": "BRL"});
                let _ =
                    http.post(&url).header("Idempotency-Key", format!("prom-{n}")).json(&body).send().await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let settled = system.transfer("PROM-A", "PROM-B", 250).await.expect("accepted");
    assert_eq!(system.final_status(&settled).await.0, "LIQUIDADA");

    let producer =
        Producer::new(&kafka::config::producer_config(&system.topics.args, "test", Duration::ZERO))
            .expect("producer");
    // a poison pill: antifraude parks it in its dead-letter topic at once
    let requested = system.topics.topic(contracts::topics::REQUESTED);
    producer.send(&OutgoingRecord::new(&requested, "PROM-A", "{not json")).await.expect("poison");
    // the settled transfer's TransferenciaAnalisada delivered a second time (as after a
    // producer retry or a replay): the ledger finds it already decided
    let analysed = system.topics.topic(contracts::topics::ANALYSED);
    let reader = kafka::consumer::subscribe(
        &kafka::config::consumer_config(
            &system.topics.args,
            "test",
            &testkit::unique("prom-reader"),
            kafka::config::OffsetCommit::StoredAfterHandling,
        ),
        &[&analysed],
    )
    .expect("reader");
    let (key, payload) = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let record = reader.recv().await.expect("receive");
            let payload = record.payload().unwrap_or_default();
            let event: Value = serde_json::from_slice(payload).unwrap_or_default();
            if event["transferenciaId"] == settled.as_str() {
                return (record.key().unwrap_or_default().to_vec(), payload.to_vec());
            }
        }
    })
    .await
    .expect("the settled transfer's TransferenciaAnalisada");
    producer.send(&OutgoingRecord::new(&analysed, key, payload)).await.expect("duplicate");

    // every dashboard query answers with at least one series that has a number to plot
    let answered = prometheus
        .wait("every dashboard query to return data", Duration::from_secs(180), || async {
            let mut empty = Vec::new();
            let mut answered = Vec::new();
            for (title, expr) in &queries {
                let result = prometheus.query(expr).await?;
                if result.iter().any(plottable) {
                    answered.push(format!("{title}: {expr} -> {} series", result.len()));
                } else {
                    empty.push(format!("{title}: {expr} -> {result:?}"));
                }
            }
            if empty.is_empty() {
                Ok(answered)
            } else {
                Err(format!(
                    "no data yet for {} of {} queries:\n  {}",
                    empty.len(),
                    queries.len(),
                    empty.join("\n  ")
                ))
            }
        })
        .await;
    eprintln!("every dashboard query answered:\n  {}", answered.join("\n  "));

    // the rules Prometheus loaded are alerts.yml's, all evaluated without error
    let rules = prometheus
        .wait("the alert rules evaluated", Duration::from_secs(60), || async {
            let data = prometheus.api("/api/v1/rules", &[]).await?;
            let rules: Vec<Value> = data["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            let unhealthy: Vec<&Value> = rules.iter().filter(|rule| rule["health"] != "ok").collect();
            if rules.is_empty() || !unhealthy.is_empty() {
                return Err(format!("rules not (all) evaluated: {rules:?}"));
            }
            Ok(rules)
        })
        .await;
    let names: Vec<&str> = rules.iter().filter_map(|rule| rule["name"].as_str()).collect();
    assert_eq!(names, alert_names(), "Prometheus loaded other rules than alerts.yml's");

    // DeadLettersWaiting's own expression finds the dead letter, and the alert is active
    // (pending, then firing after its `for:`, which the promtool unit tests cover)
    let dead_letters = format!("{requested}-dlt");
    let expr = rules
        .iter()
        .find(|rule| rule["name"] == "DeadLettersWaiting")
        .and_then(|rule| rule["query"].as_str())
        .expect("DeadLettersWaiting's query")
        .to_owned();
    let result = prometheus
        .wait(
            "DeadLettersWaiting's expression to return the dead-letter topic",
            Duration::from_secs(60),
            || async {
                let result = prometheus.query(&expr).await?;
                result
                    .iter()
                    .any(|series| series["metric"]["topic"] == dead_letters.as_str())
                    .then(|| result.clone())
                    .ok_or_else(|| format!("{expr} -> {result:?}"))
            },
        )
        .await;
    let state = prometheus
        .wait("DeadLettersWaiting active for the dead-letter topic", Duration::from_secs(60), || async {
            let data = prometheus.api("/api/v1/alerts", &[]).await?;
            let alerts = data["alerts"].as_array().cloned().unwrap_or_default();
            alerts
                .iter()
                .find(|alert| {
                    alert["labels"]["alertname"] == "DeadLettersWaiting"
                        && alert["labels"]["topic"] == dead_letters.as_str()
                })
                .map(|alert| alert["state"].as_str().unwrap_or_default().to_owned())
                .ok_or_else(|| format!("alerts: {alerts:?}"))
        })
        .await;
    assert!(["pending", "firing"].contains(&state.as_str()), "{state}");
    eprintln!("DeadLettersWaiting {state}: {expr} -> {result:?}");
    assert!(!receiver.calls().is_empty(), "the webhook was called");
    traffic.abort();
}
