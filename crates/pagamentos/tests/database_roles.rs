//! The stack's least-privilege database roles (issue #9): each service database is owned by a
//! role of its own that can reach no other database of ours, and that role can do nothing
//! outside its database. The first test runs against the databases `scripts/stack` creates, as
//! the default URLs reach them (the server's address from `PAGAMENTOS_TEST_DATABASE_URL`); it
//! only connects and reads the catalogue.
//!
//! Append-only books (issue #25): the ledger runs as a runtime role (the stack's `ledger_app`,
//! a member of `ledger_runtime`) that may insert and read entries, decisions and deposits but
//! not rewrite or remove them, and changes no schema. Those tests use databases of their own,
//! migrated by their owner, reached as `ledger_app`.
//!
//! The issuer flag locked (issue #46): `ledger_app` may update an account's balance only, never
//! its `emissor` flag, currency or id, and no account but `EMISSOR-<moeda>` can be an issuer.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};
use uuid::Uuid;

use common::system::System;
use testkit::{TestDatabase, TestTopics};

/// `default_url`'s role, password and database on the test stack's server.
fn on_test_server(default_url: &str) -> PgConnectOptions {
    let server: PgConnectOptions = testkit::admin_database_url().parse().expect("admin URL");
    let service: PgConnectOptions = default_url.parse().expect("default URL");
    service.host(server.get_host()).port(server.get_port())
}

async fn refused(options: PgConnectOptions) -> String {
    match options.connect().await {
        Ok(_) => panic!("role {} reached database {:?}", options.get_username(), options.get_database()),
        Err(sqlx::Error::Database(e)) => {
            assert_eq!(e.code().as_deref(), Some("42501"), "not a privilege refusal: {e}");
            e.message().to_owned()
        }
        Err(e) => panic!("not a privilege refusal: {e}"),
    }
}

#[tokio::test]
async fn each_service_role_reaches_its_own_database_only() {
    let transfers = on_test_server(transfers::DEFAULT_MIGRATION_DATABASE_URL);
    let ledger = on_test_server(ledger::DEFAULT_MIGRATION_DATABASE_URL);
    let transfers_runtime = on_test_server(transfers::DEFAULT_DATABASE_URL);
    let ledger_runtime = on_test_server(ledger::DEFAULT_DATABASE_URL);

    for role in [&transfers, &ledger, &transfers_runtime, &ledger_runtime] {
        let mut connection = role.connect().await.expect("a service role reaches its own database");
        let (superuser, create_db, create_role, replication, bypass_rls): (bool, bool, bool, bool, bool) =
            sqlx::query_as(
                "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls \
                 FROM pg_roles WHERE rolname = current_user",
            )
            .fetch_one(&mut connection)
            .await
            .expect("own role");
        assert_eq!(
            (superuser, create_db, create_role, replication, bypass_rls),
            (false, false, false, false, false),
            "role {} has powers beyond its database",
            role.get_username()
        );
        connection.close().await.expect("close");
    }
    // a runtime role owns nothing and may not create anything in its database
    for runtime in [&transfers_runtime, &ledger_runtime] {
        let mut connection = runtime.connect().await.expect("runtime role");
        let (owns_database, create_in_schema, temporary): (bool, bool, bool) = sqlx::query_as(
            "SELECT pg_has_role(current_user, datdba, 'USAGE'), has_schema_privilege('public', 'CREATE'), \
             has_database_privilege(current_database(), 'TEMPORARY') FROM pg_database \
             WHERE datname = current_database()",
        )
        .fetch_one(&mut connection)
        .await
        .expect("runtime role's privileges");
        assert_eq!(
            (owns_database, create_in_schema, temporary),
            (false, false, false),
            "{}",
            runtime.get_username()
        );
        connection.close().await.expect("close");
    }

    for own in [&transfers, &ledger] {
        let mut connection = own.connect().await.expect("a service role reaches its own database");
        let (superuser, create_db, create_role, replication, bypass_rls): (bool, bool, bool, bool, bool) =
            sqlx::query_as(
                "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls \
                 FROM pg_roles WHERE rolname = current_user",
            )
            .fetch_one(&mut connection)
            .await
            .expect("own role");
        assert_eq!(
            (superuser, create_db, create_role, replication, bypass_rls),
            (false, false, false, false, false),
            "role {} has powers beyond its database",
            own.get_username()
        );
        let foreign: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.relname::text, pg_get_userbyid(c.relowner)::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' AND c.relowner <> current_user::regrole",
        )
        .fetch_all(&mut connection)
        .await
        .expect("catalogue");
        assert!(foreign.is_empty(), "objects owned by other roles in {:?}: {foreign:?}", own.get_database());
        connection.close().await.expect("close");
    }

    let message = refused(transfers.clone().database("ledger")).await;
    assert!(message.contains("ledger"), "{message}");
    let message = refused(ledger.clone().database("transferencias")).await;
    assert!(message.contains("transferencias"), "{message}");
    let message = refused(ledger_runtime.clone().database("transferencias")).await;
    assert!(message.contains("transferencias"), "{message}");
    let message = refused(transfers_runtime.clone().database("ledger")).await;
    assert!(message.contains("ledger"), "{message}");
    // the tests' role creates databases of its own but cannot reach the services'
    let admin: PgConnectOptions = testkit::admin_database_url().parse().expect("admin URL");
    refused(admin.clone().database("transferencias")).await;
    refused(admin.database("ledger")).await;
}

/// `ledger_app`, the stack's runtime login role of the ledger, on the test's database `name`.
fn ledger_runtime_on(name: &str) -> PgConnectOptions {
    on_test_server(ledger::DEFAULT_DATABASE_URL).database(name)
}

fn ledger_runtime_url(name: &str) -> String {
    ledger_runtime_on(name).to_url_lossy().to_string()
}

/// `transferencias_app`, the stack's runtime login role of transferencias, on the test's
/// database `name`.
fn transfers_runtime_on(name: &str) -> PgConnectOptions {
    on_test_server(transfers::DEFAULT_DATABASE_URL).database(name)
}

/// Runs `statement` on `connection`, which must refuse it as breaking check `constraint`.
async fn refused_by_check(connection: &mut PgConnection, statement: &str, constraint: &str) {
    match sqlx::raw_sql(statement).execute(&mut *connection).await {
        Ok(_) => panic!("allowed: {statement}"),
        Err(sqlx::Error::Database(e)) => {
            assert_eq!(e.code().as_deref(), Some("23514"), "{statement}: not a check violation: {e}");
            assert_eq!(e.constraint(), Some(constraint), "{statement}: {e}");
        }
        Err(e) => panic!("{statement}: not a check violation: {e}"),
    }
}

/// Runs `statement` on `connection`, which must refuse it for want of privilege.
async fn refused_statement(connection: &mut PgConnection, statement: &str) {
    match sqlx::raw_sql(statement).execute(&mut *connection).await {
        Ok(_) => panic!("the runtime role was allowed: {statement}"),
        Err(sqlx::Error::Database(e)) => {
            assert_eq!(e.code().as_deref(), Some("42501"), "{statement}: not a privilege refusal: {e}")
        }
        Err(e) => panic!("{statement}: not a privilege refusal: {e}"),
    }
}

// Over 100 lines on purpose: one scenario on one running system, read top to bottom; its steps
// build on each other's state, so splitting it would only pass that state around.
#[tokio::test]
async fn the_ledgers_runtime_role_inserts_and_reads_the_books_but_never_rewrites_them() {
    // migrated by its owner (the tests' role), as `pagamentos migrate` does
    let database = TestDatabase::create(&ledger::MIGRATOR).await;
    let mut runtime = ledger_runtime_on(&database.name).connect().await.expect("ledger_app connects");
    let role: String =
        sqlx::query_scalar("SELECT current_user::text").fetch_one(&mut runtime).await.expect("role");
    assert_eq!(role, "ledger_app");

    // what the running ledger does: open accounts, move balances, write entries, decisions,
    // deposits and outbox events, and publish and clean up the outbox
    let transfer = Uuid::new_v4();
    let deposit = Uuid::new_v4();
    sqlx::raw_sql(&format!(
        "INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ('EMISSOR-BRL', 0, 'BRL', true); \
         INSERT INTO conta (id, saldo_centavos, moeda) VALUES ('CC-A', 0, 'BRL'), ('CC-B', 0, 'BRL'); \
         UPDATE conta SET saldo_centavos = saldo_centavos - 500 WHERE id = 'EMISSOR-BRL'; \
         UPDATE conta SET saldo_centavos = saldo_centavos + 500 WHERE id = 'CC-A'; \
         INSERT INTO deposito (id, conta_id, valor_centavos) VALUES ('{deposit}', 'CC-A', 500); \
         SELECT id FROM conta WHERE id IN ('CC-A', 'CC-B') ORDER BY id FOR UPDATE; \
         UPDATE conta SET saldo_centavos = saldo_centavos - 100 WHERE id = 'CC-A'; \
         UPDATE conta SET saldo_centavos = saldo_centavos + 100 WHERE id = 'CC-B'; \
         INSERT INTO lancamento (transferencia_id, conta_id, tipo, valor_centavos) \
           VALUES ('{transfer}', 'CC-A', 'D', 100), ('{transfer}', 'CC-B', 'C', 100); \
         INSERT INTO transferencia_processada (transferencia_id, resultado) VALUES ('{transfer}', 'LIQUIDADA') \
           ON CONFLICT (transferencia_id) DO NOTHING; \
         INSERT INTO outbox_evento (id, topico, chave, tipo, payload) \
           VALUES ('{transfer}', 'transferencias.liquidada', 'CC-A', 'TransferenciaLiquidada', '{{}}'); \
         UPDATE outbox_evento SET publicado_em = now() WHERE id = '{transfer}'; \
         DELETE FROM outbox_evento WHERE id = '{transfer}';"
    ))
    .execute(&mut runtime)
    .await
    .expect("the runtime role does what the ledger does");
    let entries: i64 = sqlx::query_scalar("SELECT count(*) FROM lancamento WHERE transferencia_id = $1")
        .bind(transfer)
        .fetch_one(&mut runtime)
        .await
        .expect("read entries");
    assert_eq!(entries, 2);

    for table in ["lancamento", "transferencia_processada", "deposito"] {
        let column = if table == "transferencia_processada" {
            "resultado = 'REJEITADA'"
        } else {
            "valor_centavos = 1"
        };
        refused_statement(&mut runtime, &format!("UPDATE {table} SET {column}")).await;
        refused_statement(&mut runtime, &format!("DELETE FROM {table}")).await;
        refused_statement(&mut runtime, &format!("TRUNCATE {table}")).await;
        refused_statement(&mut runtime, &format!("DROP TABLE {table}")).await;
        refused_statement(&mut runtime, &format!("ALTER TABLE {table} DISABLE TRIGGER ALL")).await;
    }
    refused_statement(&mut runtime, "DELETE FROM conta WHERE id = 'CC-B'").await;
    // an account's balance moves; its issuer flag, currency and id never change (issue #46)
    for statement in [
        "UPDATE conta SET emissor = true WHERE id = 'CC-B'",
        "UPDATE conta SET saldo_centavos = -1000000, emissor = true WHERE id = 'CC-B'",
        "UPDATE conta SET emissor = false WHERE id = 'EMISSOR-BRL'",
        "UPDATE conta SET moeda = 'USD' WHERE id = 'CC-B'",
        "UPDATE conta SET id = 'EMISSOR-USD' WHERE id = 'CC-B'",
        "UPDATE conta SET id = 'CC-C' WHERE id = 'CC-B'",
        "INSERT INTO conta (id, saldo_centavos, moeda) VALUES ('CC-B', 0, 'BRL') \
           ON CONFLICT (id) DO UPDATE SET emissor = true",
    ] {
        refused_statement(&mut runtime, statement).await;
    }
    // and no account is opened as an issuer but EMISSOR-<its currency>, nor that one as anything else
    for statement in [
        "INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ('CC-X', 0, 'BRL', true)",
        "INSERT INTO conta (id, saldo_centavos, moeda, emissor) VALUES ('EMISSOR-USD', 0, 'BRL', true)",
        "INSERT INTO conta (id, saldo_centavos, moeda) VALUES ('EMISSOR-USD', 0, 'USD')",
    ] {
        refused_by_check(&mut runtime, statement, "conta_emissor_check").await;
    }
    refused_statement(&mut runtime, "TRUNCATE conta CASCADE").await;
    refused_statement(&mut runtime, "DROP TABLE conta CASCADE").await;
    refused_statement(&mut runtime, "DROP TABLE outbox_evento").await;
    refused_statement(&mut runtime, "TRUNCATE outbox_evento").await;
    refused_statement(&mut runtime, "ALTER TABLE conta DROP CONSTRAINT conta_saldo_centavos_check").await;
    refused_statement(&mut runtime, "CREATE TABLE lancamento_copia (id bigint)").await;
    refused_statement(&mut runtime, "DELETE FROM _sqlx_migrations").await;
    refused_statement(&mut runtime, "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (1, 'x', true, '', 0)").await;

    // nothing of the books moved
    let (entries, decided, deposits): (i64, String, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM lancamento), \
                (SELECT resultado FROM transferencia_processada WHERE transferencia_id = $1)::text, \
                (SELECT sum(valor_centavos) FROM deposito)::bigint",
    )
    .bind(transfer)
    .fetch_one(&database.pool)
    .await
    .expect("the books");
    assert_eq!((entries, decided.as_str(), deposits), (2, "LIQUIDADA", 500));
    let accounts: Vec<(String, i64, String, bool)> =
        sqlx::query_as("SELECT id::text, saldo_centavos, moeda::text, emissor FROM conta ORDER BY id")
            .fetch_all(&database.pool)
            .await
            .expect("the accounts");
    assert_eq!(
        accounts,
        [
            ("CC-A".to_owned(), 400, "BRL".to_owned(), false),
            ("CC-B".to_owned(), 100, "BRL".to_owned(), false),
            ("EMISSOR-BRL".to_owned(), -500, "BRL".to_owned(), true),
        ]
    );
    runtime.close().await.expect("close");
}

#[tokio::test]
async fn the_transfers_runtime_role_writes_rows_but_removes_no_transfer_and_changes_no_schema() {
    let database = TestDatabase::create(&transfers::MIGRATOR).await;
    let mut runtime =
        transfers_runtime_on(&database.name).connect().await.expect("transferencias_app connects");
    let transfer = Uuid::new_v4();
    sqlx::raw_sql(&format!(
        "INSERT INTO transferencia (id, conta_origem, conta_destino, valor_centavos, moeda, status) \
           VALUES ('{transfer}', 'CC-A', 'CC-B', 100, 'BRL', 'PENDENTE'); \
         UPDATE transferencia SET status = 'LIQUIDADA', atualizada_em = now() WHERE id = '{transfer}'; \
         INSERT INTO chave_idempotencia (escopo, chave, hash_requisicao, transferencia_id, expira_em) \
           VALUES ('api', 'k', 'h', '{transfer}', now()); \
         DELETE FROM chave_idempotencia WHERE expira_em <= now(); \
         INSERT INTO outbox_evento (id, topico, chave, tipo, payload) \
           VALUES ('{transfer}', 'transferencias.solicitada', 'CC-A', 'TransferenciaSolicitada', '{{}}'); \
         UPDATE outbox_evento SET publicado_em = now() WHERE id = '{transfer}'; \
         DELETE FROM outbox_evento WHERE id = '{transfer}';"
    ))
    .execute(&mut runtime)
    .await
    .expect("the runtime role does what transferencias does");
    for statement in [
        "DELETE FROM transferencia",
        "TRUNCATE transferencia",
        "DROP TABLE transferencia",
        "TRUNCATE outbox_evento",
        "DROP TABLE chave_idempotencia",
        "ALTER TABLE transferencia ADD COLUMN x int",
        "CREATE TABLE copia (id bigint)",
        "DELETE FROM _sqlx_migrations",
    ] {
        refused_statement(&mut runtime, statement).await;
    }
    let status: String = sqlx::query_scalar("SELECT status FROM transferencia WHERE id = $1")
        .bind(transfer)
        .fetch_one(&database.pool)
        .await
        .expect("the transfer");
    assert_eq!(status, "LIQUIDADA");
    runtime.close().await.expect("close");
}

#[tokio::test]
async fn the_ledger_as_its_runtime_role_refuses_an_unmigrated_database_until_pagamentos_migrate_ran() {
    let database = TestDatabase::empty().await;
    let topics = TestTopics::plan(3).await;
    let runtime_url = ledger_runtime_url(&database.name);

    let output = common::service(&topics, "ledger")
        .env("LEDGER_LISTEN", "127.0.0.1:0")
        .env("LEDGER_DATABASE_URL", &runtime_url)
        .env("LOG_FORMAT", "pretty")
        .stderr(Stdio::piped())
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("the ledger should refuse to start, not run")
        .expect("run pagamentos ledger");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started on an unmigrated database: {stderr}");
    assert!(
        stderr.contains("pagamentos migrate") && stderr.contains("ledger_app does not own"),
        "the refusal does not say what to do: {stderr}"
    );
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&database.pool)
        .await
        .expect("tables");
    assert_eq!(tables, 0, "the runtime role changed the schema");

    // the deploy step: the owner's URL migrates, the service's URL is left alone
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pagamentos"))
        .args(["migrate", "--only", "ledger"])
        .env("LEDGER_DATABASE_URL", &runtime_url)
        .env("LEDGER_MIGRATION_DATABASE_URL", &database.url)
        .output()
        .await
        .expect("run pagamentos migrate");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("migrated"), "{output:?}");
    let owner: String =
        sqlx::query_scalar("SELECT tableowner::text FROM pg_tables WHERE tablename = 'lancamento'")
            .fetch_one(&database.pool)
            .await
            .expect("lancamento's owner");
    assert_eq!(owner, "pagamentos", "migrated by the wrong role");
}

#[tokio::test]
async fn a_transfer_settles_end_to_end_with_the_runtime_roles() {
    let system = System::new().await;
    // the deploy step, as the owner; the services then run as the runtime roles
    ledger::MIGRATOR.run(&system.ledger_db.pool).await.expect("migrate as the owner");
    transfers::MIGRATOR.run(&system.transfers_db.pool).await.expect("migrate as the owner");
    let ledger_url = ledger_runtime_url(&system.ledger_db.name);
    let transfers_url = transfers_runtime_on(&system.transfers_db.name).to_url_lossy().to_string();
    let mut all = system
        .start_with(&[
            ("LEDGER_DATABASE_URL", ledger_url.as_str()),
            ("TRANSFERENCIAS_DATABASE_URL", transfers_url.as_str()),
        ])
        .await;

    system.open_account("RT-A", 50_000).await;
    system.open_account("RT-B", 0).await;
    let settled = system.transfer("RT-A", "RT-B", 12_345).await.expect("accepted");
    assert_eq!(system.final_status(&settled).await.0, "LIQUIDADA");
    assert_eq!(system.balance("RT-A").await, 50_000 - 12_345);
    assert_eq!(system.balance("RT-B").await, 12_345);

    // every session of the services was a runtime role's
    for (database, runtime) in
        [(&system.ledger_db, "ledger_app"), (&system.transfers_db, "transferencias_app")]
    {
        let roles: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT usename::text FROM pg_stat_activity WHERE datname = $1 AND usename <> current_user",
        )
        .bind(&database.name)
        .fetch_all(&database.pool)
        .await
        .expect("sessions");
        assert_eq!(roles, [runtime]);
    }
    all.kill().await.expect("stop pagamentos all");
}
