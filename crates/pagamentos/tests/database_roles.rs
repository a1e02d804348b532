//! The stack's least-privilege database roles (issue #9): each service database is owned by a
//! role of its own that can reach no other database of ours, and that role can do nothing
//! outside its database. Runs against the databases `scripts/stack` creates, as the services'
//! default URLs reach them (the server's address from `PAGAMENTOS_TEST_DATABASE_URL`); it
//! only connects and reads the catalogue.

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};

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
    let transfers = on_test_server(transfers::DEFAULT_DATABASE_URL);
    let ledger = on_test_server(ledger::DEFAULT_DATABASE_URL);

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
    // the tests' role creates databases of its own but cannot reach the services'
    let admin: PgConnectOptions = testkit::admin_database_url().parse().expect("admin URL");
    refused(admin.clone().database("transferencias")).await;
    refused(admin.database("ledger")).await;
}
