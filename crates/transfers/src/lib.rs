//! `pagamentos transferencias`: the front door. A transfer accepted by the API is never lost and
//! is announced on Kafka exactly as committed.
//!
//! # Layout
//! - [`api`]: the REST API (`POST/GET /transferencias`), problem+json errors, Idempotency-Key,
//!   bearer tokens.
//! - [`domain`]: a transfer request and every validation rule of the contract.
//! - [`store`]: the `transferencias` database: transfer + outbox event + idempotency key in one
//!   transaction; queries; the projection's idempotent status update.
//! - [`projection`]: outcome events → final status (group `transferencias-projecao`).
//! - [`republish`]: a stuck transfer's request event written to the outbox again
//!   (`pagamentos republish`).
//! - [`verify`]: what `pagamentos verify` reads here for invariant 4.
//! - `migrations/`: the schema, embedded as [`MIGRATOR`] with the outbox's table
//!   (`outbox::migrations`).
//! - [`start`]: wires the API, the outbox relay, the backlog gauges and the projection.
//!
//! # Architecture invariant
//! Owns the `transferencias` database; no other crate writes to it. Knows other services only
//! through the contract's events.

#![forbid(unsafe_code)]

pub mod api;
pub mod domain;
pub mod error;
pub mod projection;
pub mod republish;
pub mod store;
pub mod verify;
pub mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use service::{Shell, Supervisor};

use contracts::topics;
use kafka::config::{consumer_config, OffsetCommit};
use kafka::consumer::LoopOptions;
use kafka::dead_letter::DeadLetterPublisher;
use kafka::producer::Producer;
use kafka::Profile;
use outbox::relay::{Relay, RelayOptions};

pub use error::Error;

/// The `transferencias` database's migrations with the outbox's (`outbox::migrations`), applied by
/// `pagamentos migrate` and on start.
pub static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| outbox::migrations::with_outbox(&sqlx::migrate!("./migrations")));

/// The stack's `transferencias` database, reached as its runtime role `transferencias_app` (a
/// member of `transferencias_runtime`, which the migrations allow to read and write rows but not
/// to remove transfers nor change the schema); it can connect to no other database of ours
/// (`scripts/stack` creates the roles).
pub const DEFAULT_DATABASE_URL: &str =
    "postgres://transferencias_app:transferencias_app@localhost:5432/transferencias";

/// The stack's `transferencias` database, reached as its owner role `transferencias`:
/// `pagamentos migrate`'s default.
pub const DEFAULT_MIGRATION_DATABASE_URL: &str =
    "postgres://transferencias:transferencias@localhost:5432/transferencias";

/// How often expired Idempotency-Keys are deleted.
const KEY_CLEANUP_INTERVAL: Duration = Duration::from_secs(600);

/// Options of `pagamentos transferencias`.
#[derive(Clone, clap::Args)]
pub struct TransfersArgs {
    /// Address the API listens on.
    #[arg(long = "transferencias-listen", env = "TRANSFERENCIAS_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// PostgreSQL URL of the transfers database, as the runtime role (it migrates the schema
    /// on start only if the role owns it, else checks that `pagamentos migrate` did).
    #[arg(
        long = "transferencias-database-url",
        env = "TRANSFERENCIAS_DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    pub database_url: String,

    /// Most connections in the transfers database pool.
    #[arg(long = "transferencias-database-connections", env = "TRANSFERENCIAS_DATABASE_CONNECTIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=200))]
    pub database_connections: u32,

    /// The server cancels a statement of ours running longer, in milliseconds (SQLSTATE 57014:
    /// the request answers 503, a consumer retries as with the database away); 0 = no limit.
    #[arg(
        long = "transferencias-database-statement-timeout-ms",
        value_name = "MS",
        env = "TRANSFERENCIAS_DATABASE_STATEMENT_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub database_statement_timeout_ms: u64,

    /// Longest wait for a row lock, in milliseconds; 0 = no limit.
    #[arg(
        long = "transferencias-database-lock-timeout-ms",
        value_name = "MS",
        env = "TRANSFERENCIAS_DATABASE_LOCK_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub database_lock_timeout_ms: u64,

    /// The server ends a session of ours idle inside a transaction longer, in milliseconds,
    /// releasing its locks (a hung or partitioned instance); 0 = no limit.
    #[arg(
        long = "transferencias-database-idle-in-transaction-timeout-ms",
        value_name = "MS",
        env = "TRANSFERENCIAS_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        default_value_t = 180_000
    )]
    pub database_idle_in_transaction_timeout_ms: u64,

    /// Longest wait for a pooled connection (connecting included), in milliseconds.
    #[arg(long = "transferencias-database-acquire-timeout-ms", value_name = "MS", env = "TRANSFERENCIAS_DATABASE_ACQUIRE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub database_acquire_timeout_ms: u64,

    /// How long an Idempotency-Key is remembered, in seconds.
    #[arg(long, env = "TRANSFERENCIAS_IDEMPOTENCY_KEY_TTL_SECONDS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub idempotency_key_ttl_seconds: u64,

    /// How long published outbox rows are kept before they are deleted, in seconds.
    #[arg(long, env = "OUTBOX_RETENTION_SECONDS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub outbox_retention_seconds: u64,

    /// Most unpublished outbox rows before `POST /transferencias` answers `503` with
    /// `Retry-After` (load shedding while Kafka is away: the API keeps accepting transfers
    /// until then). Measured once a second, so it may be passed by about a second's intake.
    #[arg(long, env = "TRANSFERENCIAS_OUTBOX_MAX_PENDING", default_value_t = 100_000, value_parser = clap::value_parser!(i64).range(1..))]
    pub outbox_max_pending: i64,

    /// `POST /transferencias` without an `Idempotency-Key` header is refused with `400`; `false`
    /// makes the key optional, as in the reference article's API (a client that retries
    /// without one after a lost answer may then create the transfer twice).
    #[arg(
        long,
        env = "TRANSFERENCIAS_IDEMPOTENCY_KEY_REQUIRED",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub idempotency_key_required: bool,
}

impl std::fmt::Debug for TransfersArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that no URL password, token or secret is ever printed
        f.debug_struct("TransfersArgs")
            .field("listen", &self.listen)
            .field("database_url", &telemetry::redact_url(&self.database_url))
            .field("database_connections", &self.database_connections)
            .field("database_statement_timeout_ms", &self.database_statement_timeout_ms)
            .field("database_lock_timeout_ms", &self.database_lock_timeout_ms)
            .field("database_idle_in_transaction_timeout_ms", &self.database_idle_in_transaction_timeout_ms)
            .field("database_acquire_timeout_ms", &self.database_acquire_timeout_ms)
            .field("idempotency_key_ttl_seconds", &self.idempotency_key_ttl_seconds)
            .field("outbox_retention_seconds", &self.outbox_retention_seconds)
            .field("outbox_max_pending", &self.outbox_max_pending)
            .field("idempotency_key_required", &self.idempotency_key_required)
            .finish()
    }
}

impl TransfersArgs {
    /// How the transfers pool is built from these options.
    pub fn pool_settings(&self) -> database::PoolSettings {
        database::PoolSettings {
            database: "transferencias",
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
}

/// Everything a running transfers service needs; `auth`: bearer tokens, or `--insecure-no-auth`
/// (the service refuses to start with neither).
pub type Settings = service::Settings<TransfersArgs, web::AuthArgs>;

/// transferencias as `pagamentos transferencias` and `pagamentos all` start it.
#[derive(Debug, Clone, Copy)]
pub struct Transfers;

impl service::Service for Transfers {
    const NAME: &'static str = "transferencias";
    const LISTEN_VARIABLE: &'static str = "TRANSFERENCIAS_LISTEN";
    type Args = TransfersArgs;
    type Auth = web::AuthArgs;
    type Error = Error;

    fn listen(args: &TransfersArgs) -> SocketAddr {
        args.listen
    }

    fn databases(args: &TransfersArgs) -> Vec<(&'static str, &str)> {
        vec![("TRANSFERENCIAS_DATABASE_URL", args.database_url.as_str())]
    }

    fn start(
        settings: Settings,
        supervisor: &Supervisor,
    ) -> impl std::future::Future<Output = Result<SocketAddr, Error>> {
        start(settings, supervisor)
    }
}

/// Connects, migrates, makes sure the topics exist, then spawns the API, the outbox relay,
/// the backlog gauges and the projection on `supervisor`, each a named critical task. Returns
/// the API's bound address (port 0 picks a free one). Everything stops when the supervisor's
/// shutdown token is cancelled: the API drains its requests, the relay and the projection
/// finish the batch in hand.
pub async fn start(settings: Settings, supervisor: &Supervisor) -> Result<SocketAddr, Error> {
    let Settings { args, auth, kafka, topics: topic_args, profile, metrics, producer } = settings;
    // before anything else: a service that would serve money without auth does not start
    let tokens = auth.resolve("transferencias")?;
    if !args.idempotency_key_required {
        tracing::warn!("TRANSFERENCIAS_IDEMPOTENCY_KEY_REQUIRED=false: a client that retries without an Idempotency-Key after a lost answer may create a transfer twice");
    }
    let pool = database::connect(&args.database_url, &args.pool_settings()).await?;
    // migrates as the schema's owner, and says so (/readyz, log); a runtime role only checks
    let owner = database::schema::migrate_or_check(&pool, &MIGRATOR).await?.warn_if_owner("transferencias");
    // API clients' tokens, looked up in this database's `cliente_api` (`pagamentos clients`)
    let tokens = tokens.with_clients(Arc::new(api_clients::Directory::new(pool.clone(), "transferencias")));

    let shell = Shell::begin("transferencias", supervisor, &kafka, &topic_args).await?;
    let shutdown = shell.shutdown();

    let producer = Producer::shared_or_own(producer, &kafka, "transferencias", profile.linger())?;
    let backlog = outbox::metrics::Backlog::default();
    let mut relay_options = RelayOptions::of(profile, "transferencias");
    relay_options.retention = Duration::from_secs(args.outbox_retention_seconds);
    let relay = Relay::new(pool.clone(), producer.clone(), relay_options);
    // the writer wakes the relay after its commits (the reference profile's relay only polls)
    let writer = match profile {
        Profile::Fast => writer::Writer::batched(pool.clone(), relay.waker()),
        Profile::Reference => writer::Writer::direct(pool.clone(), relay.waker()),
    };
    let state = api::AppState {
        pool: pool.clone(),
        writer,
        backlog: backlog.clone(),
        max_pending: args.outbox_max_pending,
        requested_topic: Arc::from(kafka.topic(topics::REQUESTED)),
        idempotency_ttl: Duration::from_secs(args.idempotency_key_ttl_seconds),
        idempotency_key_required: args.idempotency_key_required,
        tokens: tokens.clone(),
    };
    let checks: Vec<Arc<dyn telemetry::health::ReadinessCheck>> = vec![
        Arc::new(database::health::DatabaseReady::new(pool.clone())),
        Arc::new(kafka::health::KafkaReady::new(producer.clone(), kafka.topic(topics::REQUESTED))),
    ];
    let readiness = shell.readiness(
        checks,
        tokens.readiness_detail(),
        tokens.warnings().into_iter().chain(owner).collect(),
    );
    let app = api::router(state).merge(telemetry::health::router(readiness, metrics));
    let outcomes = [kafka.topic(topics::SETTLED), kafka.topic(topics::REJECTED)];
    let bound = shell.serve("transferencias API", args.listen, app, &outcomes, &outcomes).await?;

    shell.spawn("outbox-relay", relay.run(shutdown.clone()));
    shell.spawn(
        "outbox-gauges",
        outbox::metrics::run(pool.clone(), "transferencias", backlog, shutdown.clone()),
    );

    let group = kafka.group(topics::groups::TRANSFERS_PROJECTION);
    let settled = kafka.topic(topics::SETTLED);
    let rejected = kafka.topic(topics::REJECTED);
    let consumer = kafka::consumer::subscribe(
        &consumer_config(&kafka, "transferencias-projecao", &group, OffsetCommit::StoredAfterHandling),
        &[&settled, &rejected],
    )?;
    shell.spawn("lag-gauges", kafka::lag::report(consumer.clone(), group.clone(), shutdown.clone()));
    shell.report_dead_letters(&outcomes);
    let projection =
        projection::Projection::new(pool.clone(), settled, DeadLetterPublisher::new(producer.clone(), group));
    shell.spawn_fallible(
        "projection",
        kafka::consumer::run(consumer, projection, LoopOptions::default(), shutdown.clone()),
    );

    shell.spawn("key-cleanup", async move {
        let mut interval = tokio::time::interval(KEY_CLEANUP_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = interval.tick() => {}
            }
            match store::delete_expired_keys(&pool).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "expired Idempotency-Keys deleted"),
                Err(error) => tracing::warn!(error = %kafka::consumer::error_chain(&error), "Idempotency-Key cleanup failed"),
            }
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod migration_tests {
    /// Version and SHA-384 of every migration as deployed databases recorded them (before the
    /// outbox owned its table): sqlx refuses to start on any difference.
    #[test]
    fn migrations_keep_the_checksums_deployed_databases_recorded() {
        let recorded = [
            (20261203000001, "2352601c291942a31de0ed9667e9bcaf07e036e88858d60c9a7446d5b9fff16c1697a5c2118dc1b32e43c100cf7fdef6"),
            (20261203000002, "1fa74c58f84fe19db9766b38ddf98c1498fbe5cd275f2c35e1977913e6a8e2e743fabfd48bd22af04b2bf263c4bcd55f"),
            (20261203000003, "859978ef3f56b8e2df40ef1eacac6ff0e62cadff3ccfae346413dad45d743c639f3cd6550242901ad83a3ba4f1d2d32e"),
            (20261203000004, "10cb8b556d5bf3d7d04b67f2084fbf74e76902710290483ee542d14c91f7a7aa4b33e8479e200fabdec54e18ad6e78f6"),
            (20261205000001, "90eaba260565a7412879872ef96b98e7679eafdf8f18e45bf9d0bf5032d5438d440cd1b2f1abfb4eb51b492c4b10dd7c"),
            (20261206000001, "470937648d2a12b26e44394f12fbfc9f57825c9986f8fe9444e08a74ac736e15180e9cbf25dcf997f3bf55bf051df734"),
            (20261207000046, "65e890f9645e606a3afd8c42a12cf5f482916ce269e46aaeac9091f94d266b3906e4b6e6ca5db5624b3856be6a883c67"),
            (20261208000047, "2c4c397698294f2b1469805f717a162927482d31999f033475046b3ddcceb7f8b7a19b18cdb4f3a0e222ce3f1e5bfec7"),
        ];
        outbox::migrations::assert_checksums(&super::MIGRATOR, &recorded);
    }
}
