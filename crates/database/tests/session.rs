//! Every connection of a pool carries the session limits and keepalives, on the real server.

use std::time::Duration;

use database::{PoolSettings, Session};

fn test_database_url() -> String {
    std::env::var("PAGAMENTOS_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://pagamentos:pagamentos@localhost:5432/postgres".into())
}

#[tokio::test]
async fn every_connection_has_the_session_limits_and_the_servers_keepalives() {
    let settings = PoolSettings {
        database: "teste",
        max_connections: 2,
        acquire_timeout: Duration::from_secs(10),
        session: Session {
            statement_timeout: Duration::from_millis(1_500),
            lock_timeout: Duration::from_millis(700),
            idle_in_transaction_session_timeout: Duration::from_secs(42),
        },
    };
    let pool = database::connect(&test_database_url(), &settings).await.expect("pool");
    let show = |name: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query_scalar::<_, String>(&format!("SHOW {name}")).fetch_one(&pool).await.expect(name) }
    };
    assert_eq!(show("statement_timeout").await, "1500ms");
    assert_eq!(show("lock_timeout").await, "700ms");
    assert_eq!(show("idle_in_transaction_session_timeout").await, "42s");
    assert_eq!(show("tcp_keepalives_idle").await, "30");
    assert_eq!(show("tcp_keepalives_interval").await, "10");
    assert_eq!(show("tcp_keepalives_count").await, "3");
    assert_eq!(show("tcp_user_timeout").await, "60000"); // milliseconds, shown without a unit
    assert_eq!(show("application_name").await, "pagamentos-teste");

    // a statement past the limit is cancelled by the server: SQLSTATE 57014
    let error = sqlx::query("SELECT pg_sleep(5)").execute(&pool).await.expect_err("statement timeout");
    let code = error.as_database_error().and_then(|error| error.code()).map(|code| code.into_owned());
    assert_eq!(code.as_deref(), Some("57014"), "{error}");
}

#[tokio::test]
async fn a_host_list_without_a_reachable_server_names_them_all() {
    let settings = PoolSettings {
        database: "teste",
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
        session: Session::default(),
    };
    // two closed ports
    let error = database::connect("postgres://u:p@127.0.0.1:1,127.0.0.1:2/db", &settings)
        .await
        .expect_err("nothing listens there");
    let text = error.to_string();
    assert!(text.contains("127.0.0.1:1, 127.0.0.1:2"), "{text}");
}
