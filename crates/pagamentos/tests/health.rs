//! The operational routes as a deployment sees them (issue #25): `/readyz` answers its status to
//! every caller, so probes need no credentials, but its detail (what failed and why, warnings)
//! only to the admin token; `/metrics` on a listener of its own (`PAGAMENTOS_METRICS_LISTEN`)
//! is served there and no longer on the service ports.

use crate::common;

use std::time::Duration;

use tokio::process::Child;

use common::system::{free_port, System};
use common::{ADMIN_TOKEN, API_TOKEN};
use testkit::TestTopics;

/// `GET url` with `bearer`, if any: (status, body).
async fn get(url: &str, bearer: Option<&str>) -> (u16, String) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
    let mut request = http.get(url);
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap_or_else(|error| panic!("GET {url}: {error}"));
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// Waits until `url` answers `200` to the probe's anonymous request.
async fn wait_ready(url: &str) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    testkit::eventually(&format!("{url} ready"), Duration::from_secs(60), || async {
        http.get(url).send().await.ok()?.status().is_success().then_some(())
    })
    .await;
}

/// `pagamentos notificacoes` sending unsigned webhooks (a `warning:` on `/readyz`, so even a
/// ready service has detail to hide) on `port`, adjusted by `configure`.
fn unsigned_notifications(
    topics: &TestTopics,
    port: u16,
    configure: impl FnOnce(&mut tokio::process::Command),
) -> Child {
    let mut command = common::service(topics, "notificacoes");
    command
        .env("NOTIFICACOES_LISTEN", format!("127.0.0.1:{port}"))
        // never called: nothing is published to the test's topics
        .env("NOTIFICACOES_WEBHOOK_URL", "http://127.0.0.1:1/hooks")
        .env("NOTIFICACOES_WEBHOOK_UNSIGNED", "true")
        .env_remove("NOTIFICACOES_WEBHOOK_SECRET");
    configure(&mut command);
    command.spawn().expect("start pagamentos notificacoes")
}

/// A service without an API takes the APIs' admin token for its `/readyz` detail: with it
/// configured only its bearer reads the warnings; without it nobody does; with
/// `--insecure-no-auth` everybody does, and is told so.
#[tokio::test]
async fn readyz_detail_of_a_service_without_an_api_is_for_the_admin_token_only() {
    testkit::init_logs();
    let topics = TestTopics::plan(3).await;
    let unsigned = format!("warning: {}\n", notifications::UNSIGNED_WARNING);
    let ports = [free_port(), free_port(), free_port()];
    let _with_token = unsigned_notifications(&topics, ports[0], |_| {});
    let _without_token = unsigned_notifications(&topics, ports[1], |command| {
        command.env_remove("PAGAMENTOS_ADMIN_TOKEN");
    });
    let _insecure = unsigned_notifications(&topics, ports[2], |command| {
        command.env_remove("PAGAMENTOS_ADMIN_TOKEN").env("PAGAMENTOS_INSECURE_NO_AUTH", "true");
    });
    let readyz = ports.map(|port| format!("http://127.0.0.1:{port}/readyz"));
    for url in &readyz {
        wait_ready(url).await;
    }

    // PAGAMENTOS_ADMIN_TOKEN given: its bearer reads the warning, nobody else
    for caller in [None, Some(API_TOKEN), Some("not-a-token")] {
        assert_eq!(get(&readyz[0], caller).await, (200, "ready\n".to_owned()), "{caller:?}");
    }
    assert_eq!(get(&readyz[0], Some(ADMIN_TOKEN)).await, (200, format!("ready\n{unsigned}")));

    // none given: nobody reads it, not even with the token the others use
    for caller in [None, Some(ADMIN_TOKEN)] {
        assert_eq!(get(&readyz[1], caller).await, (200, "ready\n".to_owned()), "{caller:?}");
    }

    // --insecure-no-auth: everybody reads it, and reads that the detail is open
    let open = format!("ready\n{unsigned}warning: {}\n", telemetry::health::INSECURE_DETAIL_WARNING);
    for caller in [None, Some(ADMIN_TOKEN)] {
        assert_eq!(get(&readyz[2], caller).await, (200, open.clone()), "{caller:?}");
    }
}

/// `PAGAMENTOS_METRICS_LISTEN` moves `/metrics` of all four services of `pagamentos all` to one
/// listener: answered there (the counters alerting reads among them), `404` on every service
/// port, whose `/healthz` and `/readyz` stay; the metrics listener serves nothing else.
#[tokio::test]
async fn metrics_on_their_own_listener_are_served_there_and_not_on_the_service_ports() {
    let system = System::new().await;
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let _all = system.start_with(&[("PAGAMENTOS_METRICS_LISTEN", &listen)]).await;

    let (status, body) = get(&format!("http://{listen}/metrics"), None).await;
    assert_eq!(status, 200, "{body}");
    // exported at 0 from the start by antifraude, which alerting reads
    let retries =
        format!("retries_total{{topic=\"{}\"}} 0", system.topics.topic(contracts::topics::REQUESTED));
    assert!(body.lines().any(|line| line == retries), "{retries} not in\n{body}");
    for path in ["/readyz", "/healthz", "/transferencias"] {
        assert_eq!(get(&format!("http://{listen}{path}"), Some(ADMIN_TOKEN)).await.0, 404, "{path}");
    }

    for port in system.ports {
        let (status, body) = get(&format!("http://127.0.0.1:{port}/metrics"), Some(ADMIN_TOKEN)).await;
        assert_eq!(status, 404, "port {port} still serves /metrics: {body}");
        assert!(!body.contains("retries_total"), "{body}");
        assert_eq!(get(&format!("http://127.0.0.1:{port}/healthz"), None).await.0, 200, "port {port}");
        assert_eq!(get(&format!("http://127.0.0.1:{port}/readyz"), None).await.0, 200, "port {port}");
    }
}
