//! `pagamentos ledger`: where money moves. A transfer delivered any number of times is decided
//! once, as a double entry; accounts never go below zero; every business rejection becomes an
//! event; outcomes are pinned; the books can be proved balanced.
//!
//! # Layout
//! - [`settlement`]: the rules, pure: one transfer against the locked accounts → settled or
//!   rejected with the contract's reason.
//! - [`store`]: the `ledger` database: batched settlement (business-key idempotency, accounts
//!   locked in id order, entries, balances, outcome events into the outbox, one transaction),
//!   accounts, deposits, entries.
//! - [`settler`]: the consumer of `transferencias.analisada` (group `ledger`): batches,
//!   blocking retries of transient failures, dead letters, infrastructure loss waited out.
//! - [`api`]: the accounts API (`/contas…`) and its OpenAPI document.
//! - [`verify`]: the ledger's invariants 1–3 as set-based SQL.
//! - `migrations/`: the schema, embedded as [`MIGRATOR`] with the outbox's table
//!   (`outbox::migrations`).
//! - [`start`]: wires the API, the settler, the outbox relay and the gauges.
//! - `testing`: setup shared by tests (accounts opened, transfers settled), hidden from the
//!   docs.
//!
//! # Architecture invariant
//! Owns the `ledger` database; no other crate writes to it. Knows other services only through
//! the contract's events.

#![forbid(unsafe_code)]

pub mod api;
pub mod error;
pub mod republish;
pub mod settlement;
pub mod settler;
pub mod store;
#[doc(hidden)]
pub mod testing;
pub mod verify;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use service::{Shell, Supervisor};

use contracts::topics;
use kafka::config::{consumer_config, OffsetCommit};
use kafka::consumer::{Backoff, LoopOptions};
use kafka::dead_letter::DeadLetterPublisher;
use kafka::producer::Producer;
use kafka::Profile;
use outbox::relay::{Relay, RelayOptions};

pub use error::{Error, StoreError};

/// The `ledger` database's migrations with the outbox's (`outbox::migrations`), applied by
/// `pagamentos migrate` and on start.
pub static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| outbox::migrations::with_outbox(&sqlx::migrate!("./migrations")));

/// The stack's `ledger` database, reached as its runtime role `ledger_app` (a member of
/// `ledger_runtime`, which the migrations allow to insert and read the books but not to rewrite
/// them, nor to change the schema); it can connect to no other database of ours (`scripts/stack`
/// creates both roles).
pub const DEFAULT_DATABASE_URL: &str = "postgres://ledger_app:ledger_app@localhost:5432/ledger";

/// The stack's `ledger` database, reached as its owner role `ledger`: `pagamentos migrate`'s
/// default.
pub const DEFAULT_MIGRATION_DATABASE_URL: &str = "postgres://ledger:ledger@localhost:5432/ledger";

/// Options of `pagamentos ledger`.
#[derive(Clone, clap::Args)]
pub struct LedgerArgs {
    /// Address the accounts API (and health, metrics) listens on.
    #[arg(
        id = "ledger_listen",
        value_name = "LISTEN",
        long = "ledger-listen",
        env = "LEDGER_LISTEN",
        default_value = "0.0.0.0:8081"
    )]
    pub listen: SocketAddr,

    /// PostgreSQL URL of the ledger database, as the runtime role (it migrates the schema on
    /// start only if the role owns it, else checks that `pagamentos migrate` did).
    #[arg(
        id = "ledger_database_url",
        value_name = "DATABASE_URL",
        long = "ledger-database-url",
        env = "LEDGER_DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    pub database_url: String,

    /// Most connections in the ledger database pool.
    #[arg(id = "ledger_database_connections", value_name = "DATABASE_CONNECTIONS", long = "ledger-database-connections", env = "LEDGER_DATABASE_CONNECTIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=200))]
    pub database_connections: u32,

    /// The server cancels a statement of ours running longer, in milliseconds (SQLSTATE 57014:
    /// the batch is retried as with the database away, never dead-lettered); 0 = no limit.
    #[arg(
        id = "ledger_database_statement_timeout_ms",
        value_name = "MS",
        long = "ledger-database-statement-timeout-ms",
        env = "LEDGER_DATABASE_STATEMENT_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub database_statement_timeout_ms: u64,

    /// Longest wait for a row lock, in milliseconds (SQLSTATE 55P03: retried, then
    /// dead-lettered); 0 = no limit.
    #[arg(
        id = "ledger_database_lock_timeout_ms",
        value_name = "MS",
        long = "ledger-database-lock-timeout-ms",
        env = "LEDGER_DATABASE_LOCK_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub database_lock_timeout_ms: u64,

    /// The server ends a session of ours idle inside a transaction longer, in milliseconds,
    /// releasing its locks (a hung or partitioned instance); 0 = no limit.
    #[arg(
        id = "ledger_database_idle_in_transaction_timeout_ms",
        value_name = "MS",
        long = "ledger-database-idle-in-transaction-timeout-ms",
        env = "LEDGER_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        default_value_t = 180_000
    )]
    pub database_idle_in_transaction_timeout_ms: u64,

    /// Longest wait for a pooled connection (connecting included), in milliseconds; past it
    /// the work is retried as with the database away.
    #[arg(id = "ledger_database_acquire_timeout_ms", value_name = "MS", long = "ledger-database-acquire-timeout-ms", env = "LEDGER_DATABASE_ACQUIRE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub database_acquire_timeout_ms: u64,

    /// Most transfers settled in one database transaction (`fast` profile; `reference`
    /// settles one per transaction).
    #[arg(id = "ledger_ledger_batch_records", value_name = "LEDGER_BATCH_RECORDS", long = "ledger-batch-records", env = "LEDGER_BATCH_RECORDS", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub ledger_batch_records: u32,

    /// How long a batch waits for more records after its first, in milliseconds (0: what the
    /// poll already fetched).
    #[arg(id = "ledger_ledger_batch_wait_ms", value_name = "LEDGER_BATCH_WAIT_MS", long = "ledger-batch-wait-ms", env = "LEDGER_BATCH_WAIT_MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub ledger_batch_wait_ms: u64,

    /// First pause before retrying a transfer that failed transiently, in milliseconds; it
    /// doubles on every retry.
    #[arg(id = "ledger_ledger_retry_initial_ms", value_name = "LEDGER_RETRY_INITIAL_MS", long = "ledger-retry-initial-ms", env = "LEDGER_RETRY_INITIAL_MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub ledger_retry_initial_ms: u64,

    /// Longest pause between retries, in milliseconds.
    #[arg(id = "ledger_ledger_retry_max_ms", value_name = "LEDGER_RETRY_MAX_MS", long = "ledger-retry-max-ms", env = "LEDGER_RETRY_MAX_MS", default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub ledger_retry_max_ms: u64,

    /// Retries of a transiently failing transfer before it goes to the dead-letter topic.
    #[arg(id = "ledger_ledger_retries", value_name = "LEDGER_RETRIES", long = "ledger-retries", env = "LEDGER_RETRIES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub ledger_retries: u32,

    /// How long published outbox rows are kept before they are deleted, in seconds.
    #[arg(id = "ledger_outbox_retention_seconds", value_name = "OUTBOX_RETENTION_SECONDS", long = "ledger-outbox-retention-seconds", env = "OUTBOX_RETENTION_SECONDS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub outbox_retention_seconds: u64,
}

impl std::fmt::Debug for LedgerArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that no URL password, token or secret is ever printed
        f.debug_struct("LedgerArgs")
            .field("listen", &self.listen)
            .field("database_url", &telemetry::redact_url(&self.database_url))
            .field("database_connections", &self.database_connections)
            .field("database_statement_timeout_ms", &self.database_statement_timeout_ms)
            .field("database_lock_timeout_ms", &self.database_lock_timeout_ms)
            .field("database_idle_in_transaction_timeout_ms", &self.database_idle_in_transaction_timeout_ms)
            .field("database_acquire_timeout_ms", &self.database_acquire_timeout_ms)
            .field("ledger_batch_records", &self.ledger_batch_records)
            .field("ledger_batch_wait_ms", &self.ledger_batch_wait_ms)
            .field("ledger_retry_initial_ms", &self.ledger_retry_initial_ms)
            .field("ledger_retry_max_ms", &self.ledger_retry_max_ms)
            .field("ledger_retries", &self.ledger_retries)
            .field("outbox_retention_seconds", &self.outbox_retention_seconds)
            .finish()
    }
}

impl LedgerArgs {
    /// How the ledger's pool is built from these options.
    pub fn pool_settings(&self) -> database::PoolSettings {
        database::PoolSettings {
            database: "ledger",
            max_connections: self.database_connections,
            acquire_timeout: Duration::from_millis(self.database_acquire_timeout_ms),
            session: database::Session {
                statement_timeout: Duration::from_millis(self.database_statement_timeout_ms),
                lock_timeout: Duration::from_millis(self.database_lock_timeout_ms),
                idle_in_transaction_session_timeout: Duration::from_millis(
                    self.database_idle_in_transaction_timeout_ms,
                ),
            },
        }
    }

    /// The blocking retry policy these options describe.
    pub fn retry_policy(&self) -> settler::RetryPolicy {
        settler::RetryPolicy {
            backoff: Backoff {
                initial: Duration::from_millis(self.ledger_retry_initial_ms),
                multiplier: 2.0,
                max: Duration::from_millis(self.ledger_retry_max_ms),
            },
            retries: self.ledger_retries,
        }
    }
}

/// Everything a running ledger needs; `auth`: bearer tokens, or `--insecure-no-auth` (the
/// service refuses to start with neither).
pub type Settings = service::Settings<LedgerArgs, web::AuthArgs>;

/// ledger as `pagamentos ledger` and `pagamentos all` start it.
#[derive(Debug, Clone, Copy)]
pub struct Ledger;

impl service::Service for Ledger {
    const NAME: &'static str = "ledger";
    const LISTEN_VARIABLE: &'static str = "LEDGER_LISTEN";
    type Args = LedgerArgs;
    type Auth = web::AuthArgs;
    type Error = Error;

    fn listen(args: &LedgerArgs) -> SocketAddr {
        args.listen
    }

    fn databases(args: &LedgerArgs) -> Vec<(&'static str, &str)> {
        vec![("LEDGER_DATABASE_URL", args.database_url.as_str())]
    }

    fn start(
        settings: Settings,
        supervisor: &Supervisor,
    ) -> impl std::future::Future<Output = Result<SocketAddr, Error>> {
        start(settings, supervisor)
    }
}

/// Connects, migrates, makes sure the topics exist, then spawns the accounts API, the settler,
/// the outbox relay and the backlog gauges on `supervisor`, each a named critical task. Returns
/// the API's bound address (port 0 picks a free one). Everything stops when the supervisor's
/// shutdown token is cancelled: the API drains its requests, the settler finishes (and
/// commits) the batch in hand, the relay its batch.
pub async fn start(settings: Settings, supervisor: &Supervisor) -> Result<SocketAddr, Error> {
    let Settings { args, auth, kafka, topics: topic_args, profile, metrics, producer } = settings;
    // before anything else: a service that would let anyone create money does not start
    let tokens = auth.resolve("ledger")?;
    let pool = database::connect(&args.database_url, &args.pool_settings()).await?;
    // migrates as the schema's owner, and says so (/readyz, log); a runtime role only checks
    let owner = database::schema::migrate_or_check(&pool, &MIGRATOR).await?.warn_if_owner("ledger");
    // API clients' tokens, looked up in this database's own `cliente_api` (`pagamentos clients`
    // writes it here too: the ledger never reads the transfers database)
    let tokens = tokens.with_clients(Arc::new(api_clients::Directory::new(pool.clone(), "ledger")));

    let shell = Shell::begin("ledger", supervisor, &kafka, &topic_args).await?;
    let shutdown = shell.shutdown();

    let group = kafka.group(topics::groups::LEDGER);
    let input = kafka.topic(topics::ANALYSED);
    let producer = Producer::shared_or_own(producer, &kafka, "ledger", profile.linger())?;
    let state = api::AppState { pool: pool.clone(), tokens: tokens.clone() };
    let checks: Vec<Arc<dyn telemetry::health::ReadinessCheck>> = vec![
        Arc::new(database::health::DatabaseReady::new(pool.clone())),
        Arc::new(kafka::health::KafkaReady::new(producer.clone(), input.clone())),
    ];
    let readiness = shell.readiness(
        checks,
        tokens.readiness_detail(),
        tokens.warnings().into_iter().chain(owner).collect(),
    );
    let app = api::router(state).merge(telemetry::health::router(readiness, metrics));
    let inputs = std::slice::from_ref(&input);
    let bound = shell.serve("ledger API", args.listen, app, inputs, inputs).await?;

    let mut relay_options = RelayOptions::of(profile, "ledger");
    relay_options.retention = Duration::from_secs(args.outbox_retention_seconds);
    let relay = Relay::new(pool.clone(), producer.clone(), relay_options);
    // the settler wakes the relay after its commits (the reference profile's relay only polls)
    let relay_waker = relay.waker();
    shell.spawn("outbox-relay", relay.run(shutdown.clone()));
    shell.spawn(
        "outbox-gauges",
        outbox::metrics::run(pool.clone(), "ledger", outbox::metrics::Backlog::default(), shutdown.clone()),
    );

    let consumer = kafka::consumer::subscribe(
        &consumer_config(&kafka, "ledger", &group, OffsetCommit::StoredAfterHandling),
        &[&input],
    )?;
    shell.spawn("lag-gauges", kafka::lag::report(consumer.clone(), group.clone(), shutdown.clone()));
    shell.report_dead_letters(inputs);
    let retry = args.retry_policy();
    tracing::info!(
        group,
        retries = retry.retries,
        worst_case_retry_ms = settler::worst_case_retry_time(&retry).as_millis() as u64,
        "ledger starting"
    );
    let settler = settler::Settler::new(
        pool,
        store::OutcomeTopics {
            settled: kafka.topic(topics::SETTLED),
            rejected: kafka.topic(topics::REJECTED),
        },
        relay_waker,
    );
    let loop_options = LoopOptions {
        // the article settles one transfer per database transaction
        batch_records_max: if profile == Profile::Reference { 1 } else { args.ledger_batch_records as usize },
        batch_wait_max: Duration::from_millis(args.ledger_batch_wait_ms),
        // a batch failed as a whole (the database away) waits as a retried record does
        backoff: retry.backoff.clone(),
        record_retry: retry,
        dead_letters: Some(DeadLetterPublisher::new(producer, group)),
        ..LoopOptions::default()
    };
    shell.spawn_fallible("settler", kafka::consumer::run(consumer, settler, loop_options, shutdown));
    Ok(bound)
}

#[cfg(test)]
mod migration_tests {
    /// Version and SHA-384 of every migration as deployed databases recorded them (before the
    /// outbox owned its table): sqlx refuses to start on any difference.
    #[test]
    fn migrations_keep_the_checksums_deployed_databases_recorded() {
        let recorded = [
            (20261203000001, "ce35e83a5ce64af537d5327196d176f0235145ee7f9e20c05e0cd15597031b2e744addbb545ddf7ef1ad119aae5b5fac"),
            (20261203000002, "5d46fe9f814d0dae9c8de734bf8b486d16489a4e2c9a29782be3a0a27e6ef7b3a341f619f73f1676eacf3b1ec7b44c95"),
            (20261203000003, "859978ef3f56b8e2df40ef1eacac6ff0e62cadff3ccfae346413dad45d743c639f3cd6550242901ad83a3ba4f1d2d32e"),
            (20261203000004, "10cb8b556d5bf3d7d04b67f2084fbf74e76902710290483ee542d14c91f7a7aa4b33e8479e200fabdec54e18ad6e78f6"),
            (20261205000001, "37cea8c26ba235a68143976c149db0b7b53110c0d0bbf4494c52bd26e18177358206ec194ba2bcdf539ff2ad3c7c9725"),
            (20261206000001, "470937648d2a12b26e44394f12fbfc9f57825c9986f8fe9444e08a74ac736e15180e9cbf25dcf997f3bf55bf051df734"),
            (20261207000046, "6da60a46eeb5e8569fb5f8e2747125d16c6ec14c1eab5e44f6d73cff3369a26af759ca281545115a5c49147a87105ea2"),
            (20261207100046, "34ae3f8c3ae5121bdb856e2b749da1afc0bd97a4aa8ae8c3787a19567d2bcc39dff0aef109c7717c5171c003af92b01e"),
            (20261208000047, "2c4c397698294f2b1469805f717a162927482d31999f033475046b3ddcceb7f8b7a19b18cdb4f3a0e222ce3f1e5bfec7"),
        ];
        outbox::migrations::assert_checksums(&super::MIGRATOR, &recorded);
    }
}
