//! How every service reaches PostgreSQL: a pool whose connections carry server-side timeouts
//! and keepalives, whose `acquire` is bounded, and which follows a failover to whichever server
//! of a host list takes writes.
//!
//! # Layout
//! - [`Session`]: `statement_timeout`, `lock_timeout`, `idle_in_transaction_session_timeout`
//!   and the server's TCP keepalives, sent as startup options with every connection.
//! - [`Hosts`]: a database URL naming one server or several, libpq style
//!   (`postgres://user:pw@db1:5432,db2:5432/ledger?target_session_attrs=read-write`).
//! - [`connect`]: the pool on the read-write server of the list; with more than one host a
//!   watcher probes it once a second and, when it stops taking writes, points the pool at the
//!   first server that does (`database_failovers_total{database}`).
//! - [`failure`]: a failed operation's kind by SQLSTATE: the record's fault, a passing
//!   condition, or the database unable to serve now.
//! - [`health`]: PostgreSQL readiness for `/readyz`.
//! - [`schema`]: the start-up rule of a service's own database: migrate as the schema's owner,
//!   else check that every migration is applied (a runtime role may not change the schema).
//!
//! # Why not sqlx's own
//! sqlx 0.8 takes one host per URL (a comma-separated list does not parse; it warns about and
//! ignores `target_session_attrs`) and sets no option on its TCP socket other than
//! `TCP_NODELAY`, so a client-side keepalive or `TCP_USER_TIMEOUT` cannot be had. What can be:
//! the server's keepalives (it drops a vanished client and frees its locks), server-side
//! statement timeouts, a bounded `acquire`, and the host list here.
//!
//! # Architecture invariant
//! Knows nothing of the services' tables: how to reach a server that takes writes, what its
//! errors mean, whether it answers, and whether a migrator's migrations are applied.

#![forbid(unsafe_code)]

pub mod columns;
pub mod failure;
pub mod health;
pub mod schema;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions as _, PgConnection, PgPool};
use telemetry::transport::Exposure;

/// The server's TCP keepalives on our connections: idle time before the first probe,
/// interval, and probes lost before the server drops a client that vanished (about 60 s), so
/// a crashed or partitioned client's locks and backend are freed.
pub const TCP_KEEPALIVES_IDLE_SECONDS: u32 = 30;
pub const TCP_KEEPALIVES_INTERVAL_SECONDS: u32 = 10;
pub const TCP_KEEPALIVES_COUNT: u32 = 3;
/// The server's `tcp_user_timeout`: data it sent that stays unacknowledged this long closes
/// the connection (the keepalives above cover an idle one).
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the failover watcher asks the current server whether it still takes writes.
pub const FAILOVER_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long one probe (connect and `SHOW transaction_read_only`) may take.
pub const FAILOVER_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Server-side limits of every session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// A statement running longer is cancelled by the server (SQLSTATE 57014); 0 = no limit.
    pub statement_timeout: Duration,
    /// Waiting longer for a lock fails the statement (55P03); 0 = no limit.
    pub lock_timeout: Duration,
    /// A session idle inside a transaction longer is ended by the server (25P03), releasing
    /// its locks; 0 = no limit.
    pub idle_in_transaction_session_timeout: Duration,
}

impl Default for Session {
    fn default() -> Self {
        Self {
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(10),
            // above the outbox relay's longest claim while Kafka is away (the producer's
            // delivery.timeout.ms, 120 s), which it holds in a transaction
            idle_in_transaction_session_timeout: Duration::from_secs(180),
        }
    }
}

impl Session {
    /// `options` with these limits and the server's keepalives as startup options.
    pub fn apply(&self, options: PgConnectOptions) -> PgConnectOptions {
        options.options([
            ("statement_timeout", milliseconds(self.statement_timeout)),
            ("lock_timeout", milliseconds(self.lock_timeout)),
            ("idle_in_transaction_session_timeout", milliseconds(self.idle_in_transaction_session_timeout)),
            ("tcp_keepalives_idle", TCP_KEEPALIVES_IDLE_SECONDS.to_string()),
            ("tcp_keepalives_interval", TCP_KEEPALIVES_INTERVAL_SECONDS.to_string()),
            ("tcp_keepalives_count", TCP_KEEPALIVES_COUNT.to_string()),
            ("tcp_user_timeout", milliseconds(TCP_USER_TIMEOUT)),
        ])
    }
}

fn milliseconds(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// Why no pool could be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid database URL: {0}")]
    Url(String),
    #[error("invalid database URL for {address}")]
    Parse {
        address: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("PostgreSQL at {address} unreachable")]
    Connect {
        address: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("no PostgreSQL server among {addresses} takes writes (all are read-only standbys)")]
    NoReadWrite { addresses: String },
}

/// The servers a database URL names, in the order they are tried.
#[derive(Clone)]
pub struct Hosts {
    servers: Vec<PgConnectOptions>,
}

impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the addresses only: no password
        f.write_str(&self.addresses())
    }
}

impl Hosts {
    /// Parses a PostgreSQL URL with one host or a comma-separated list of `host[:port]`, as
    /// libpq reads it. `target_session_attrs` may be `read-write` or `primary` (what the
    /// services need anyway, and what they always ask for); any other value is refused, since
    /// a service that writes cannot use a standby.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| Error::Url("expected postgres://…".into()))?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (user, host_list) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (Some(user), hosts),
            None => (None, authority),
        };
        let tail = strip_target_session_attrs(tail)?;
        let hosts: Vec<&str> = host_list.split(',').collect();
        if hosts.len() > 1 && hosts.iter().any(|host| host.is_empty()) {
            return Err(Error::Url(format!("an empty host in the list '{host_list}'")));
        }
        let servers = hosts
            .iter()
            .map(|host| {
                let single = match user {
                    Some(user) => format!("{scheme}://{user}@{host}{tail}"),
                    None => format!("{scheme}://{host}{tail}"),
                };
                single.parse::<PgConnectOptions>().map_err(|source| Error::Parse {
                    address: if host.is_empty() { "(default host)".into() } else { (*host).to_owned() },
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { servers })
    }

    /// `host:port` of each server, comma-separated, for messages.
    pub fn addresses(&self) -> String {
        self.servers.iter().map(address).collect::<Vec<_>>().join(", ")
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// `host:port` and `sslmode` of each server of the list that would be reached unverified
    /// off the machine ([`unverified_off_machine`]), as the URL (and `PG*` variables) say.
    pub fn unverified_off_machine(&self) -> Vec<(String, PgSslMode)> {
        self.servers
            .iter()
            .filter(|server| {
                let socket = server.get_socket().is_some() || server.get_host().starts_with('/');
                unverified_off_machine(server.get_host(), socket, server.get_ssl_mode())
            })
            .map(|server| (address(server), server.get_ssl_mode()))
            .collect()
    }
}

/// Whether a connection to `host` (a Unix socket when `socket`) with `mode` would leave the
/// machine without a verified TLS connection (`docs/reference/contract.md` §1, *Transport fails closed*): a
/// host that is not a loopback address (`telemetry::transport::is_loopback`: no name but
/// `localhost` counts, nothing is resolved) with any `sslmode` below `verify-full`: `disable`,
/// `allow` and `prefer` may send everything in the clear, `require` and `verify-ca` accept a
/// server that is not the host named (a man in the middle with any certificate, or any
/// certificate of the CA).
pub fn unverified_off_machine(host: &str, socket: bool, mode: PgSslMode) -> bool {
    !socket && !telemetry::transport::is_loopback(host) && !matches!(mode, PgSslMode::VerifyFull)
}

/// `sslmode` as written in a URL.
pub fn ssl_mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// The servers of `url`, the value of the setting `setting` (e.g. `LEDGER_DATABASE_URL`), that
/// would be reached unverified off the machine, for the check where each command starts
/// (`telemetry::transport::TransportArgs::check`), before anything connects. A URL that does
/// not parse is an error naming the setting (nothing could connect with it either).
pub fn transport_exposures(setting: &'static str, url: &str) -> Result<Vec<Exposure>, Error> {
    let hosts = Hosts::parse(url).map_err(|error| Error::Url(format!("{setting}: {error}")))?;
    Ok(hosts
        .unverified_off_machine()
        .into_iter()
        .map(|(address, mode)| Exposure {
            setting,
            address,
            why: format!("its sslmode is {} (verify-full needed, with sslrootcert)", ssl_mode_name(mode)),
        })
        .collect())
}

/// `tail` (path and query of a URL) without `target_session_attrs`, which sqlx does not know.
fn strip_target_session_attrs(tail: &str) -> Result<String, Error> {
    let Some((path, query)) = tail.split_once('?') else { return Ok(tail.to_owned()) };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", "read-write" | "primary")) => {}
            Some(("target_session_attrs", other)) => {
                return Err(Error::Url(format!(
                    "target_session_attrs={other}: the services write, so only read-write (or primary) is possible"
                )))
            }
            _ => kept.push(pair),
        }
    }
    Ok(if kept.is_empty() { path.to_owned() } else { format!("{path}?{}", kept.join("&")) })
}

fn address(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// `host:port/database`: what a connection error names, so the operator sees which database.
fn address_and_database(options: &PgConnectOptions) -> String {
    format!("{}/{}", address(options), options.get_database().unwrap_or_default())
}

/// How a service's pool is built.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// The database's name in logs and metrics (`transferencias`, `ledger`).
    pub database: &'static str,
    pub max_connections: u32,
    /// Longest wait for a connection (also bounds connecting): past it the operation fails
    /// with a pool timeout, which every consumer treats as the database being away.
    pub acquire_timeout: Duration,
    pub session: Session,
}

/// Whether the server behind `connection` refuses writes (a standby, or a primary set
/// read-only), as libpq's `target_session_attrs=read-write` asks it.
pub async fn read_only(connection: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let value: String = sqlx::query_scalar("SHOW transaction_read_only").fetch_one(connection).await?;
    Ok(value == "on")
}

/// A connection to `server` and whether it takes writes, within [`FAILOVER_PROBE_TIMEOUT`].
async fn probe(server: &PgConnectOptions, timeout: Duration) -> Result<(PgConnection, bool), sqlx::Error> {
    let attempt = async {
        let mut connection = server.connect().await?;
        let read_only = read_only(&mut connection).await?;
        Ok::<_, sqlx::Error>((connection, !read_only))
    };
    tokio::time::timeout(timeout, attempt).await.map_err(|_| sqlx::Error::PoolTimedOut)?
}

/// The first server of `servers` that takes writes, with a connection to it.
async fn first_read_write(
    servers: &[PgConnectOptions],
    timeout: Duration,
) -> Result<(usize, PgConnection), Error> {
    let mut unreachable = None;
    for (index, server) in servers.iter().enumerate() {
        match probe(server, timeout).await {
            Ok((connection, true)) => return Ok((index, connection)),
            Ok((_, false)) => tracing::debug!(server = address(server), "read-only server skipped"),
            Err(source) => {
                unreachable = Some(Error::Connect { address: address_and_database(server), source })
            }
        }
    }
    // one server: say why it failed; several: that none takes writes, or the last failure
    match unreachable {
        Some(error) if servers.len() == 1 => Err(error),
        _ => {
            Err(Error::NoReadWrite { addresses: servers.iter().map(address).collect::<Vec<_>>().join(", ") })
        }
    }
}

/// A pool on the first server of `url` that takes writes. Every connection carries
/// `settings.session` and is checked to take writes (a standby's is refused, so a pool behind
/// a virtual IP or DNS name never keeps one to a demoted server). With several hosts, a
/// watcher task follows a failover for as long as the pool is open.
pub async fn connect(url: &str, settings: &PoolSettings) -> Result<PgPool, Error> {
    let hosts = Hosts::parse(url)?;
    let servers: Vec<PgConnectOptions> = hosts
        .servers
        .into_iter()
        .map(|server| {
            let server = settings.session.apply(server);
            if server.get_application_name().is_some() {
                server
            } else {
                server.application_name(&format!("pagamentos-{}", settings.database))
            }
        })
        .collect();
    let connect_timeout = settings.acquire_timeout;
    // one plain connection first: a pool would hide "connection refused" behind its timeout
    let (current, _probe) = first_read_write(&servers, connect_timeout).await?;
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .after_connect(|connection, _| {
            Box::pin(async move {
                if read_only(connection).await? {
                    return Err(sqlx::Error::Protocol(
                        "connected to a read-only PostgreSQL server (a standby?); a read-write one is needed"
                            .into(),
                    ));
                }
                Ok(())
            })
        })
        .connect_with(servers[current].clone())
        .await
        .map_err(|source| Error::Connect { address: address_and_database(&servers[current]), source })?;
    if servers.len() > 1 {
        tracing::info!(
            database = settings.database,
            server = address(&servers[current]),
            servers = servers.len(),
            "database pool on the read-write server of its list"
        );
        metrics::counter!("database_failovers_total", "database" => settings.database).absolute(0);
        tokio::spawn(follow_failover(pool.clone(), servers, current, settings.database));
    }
    Ok(pool)
}

/// Probes the pool's server once a second; when it stops answering as a read-write server,
/// looks for the first one of `servers` that does and points the pool's new connections at it
/// (connections to the old one fail their test on acquire and are dropped).
async fn follow_failover(
    pool: PgPool,
    servers: Vec<PgConnectOptions>,
    mut current: usize,
    database: &'static str,
) {
    let mut probe: Option<PgConnection> = None;
    let mut searching_since: Option<std::time::Instant> = None;
    loop {
        tokio::time::sleep(FAILOVER_PROBE_INTERVAL).await;
        if pool.is_closed() {
            return;
        }
        if let Some(connection) = probe.as_mut() {
            let answer = tokio::time::timeout(FAILOVER_PROBE_TIMEOUT, read_only(connection)).await;
            if matches!(answer, Ok(Ok(false))) {
                continue;
            }
            tracing::warn!(
                database,
                server = address(&servers[current]),
                "database server no longer answers as read-write; looking for the one that does"
            );
        }
        probe = None;
        match first_read_write(&servers, FAILOVER_PROBE_TIMEOUT).await {
            Ok((index, connection)) => {
                probe = Some(connection);
                if index != current {
                    pool.set_connect_options(servers[index].clone());
                    metrics::counter!("database_failovers_total", "database" => database).increment(1);
                    tracing::warn!(
                        database,
                        from = address(&servers[current]),
                        to = address(&servers[index]),
                        searched_ms = searching_since.map_or(0, |since| since.elapsed().as_millis() as u64),
                        "database failover: new connections go to the server that takes writes"
                    );
                    current = index;
                }
                searching_since = None;
            }
            Err(error) => {
                if searching_since.is_none() {
                    tracing::error!(database, %error, "no database server takes writes; still looking");
                    searching_since = Some(std::time::Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_parses_as_before() {
        let hosts =
            Hosts::parse("postgres://ledger:secret@db.internal:6543/ledger?sslmode=disable").expect("url");
        assert_eq!(hosts.addresses(), "db.internal:6543");
        assert_eq!(hosts.servers[0].get_database(), Some("ledger"));
        assert_eq!(hosts.servers[0].get_username(), "ledger");
    }

    #[test]
    fn a_host_list_gives_one_server_each_with_the_same_user_and_database() {
        let hosts = Hosts::parse(
            "postgres://ledger:s3cret@db1:5442,db2:5443,db3/ledger?target_session_attrs=read-write&sslmode=prefer",
        )
        .expect("url");
        assert_eq!(hosts.addresses(), "db1:5442, db2:5443, db3:5432");
        for server in &hosts.servers {
            assert_eq!(server.get_database(), Some("ledger"));
            assert_eq!(server.get_username(), "ledger");
        }
        assert!(!format!("{hosts:?}").contains("s3cret"), "no password in Debug");
    }

    #[test]
    fn a_session_attribute_that_allows_a_standby_is_refused() {
        for attrs in ["any", "read-only", "standby", "prefer-standby"] {
            let error = Hosts::parse(&format!("postgres://u@a,b/db?target_session_attrs={attrs}"))
                .expect_err("a standby cannot take writes");
            assert!(error.to_string().contains("read-write"), "{error}");
        }
        assert!(Hosts::parse("postgres://u@a,,b/db").is_err(), "an empty host");
        assert!(Hosts::parse("ledger.internal/db").is_err(), "no scheme");
    }

    const EVERY_MODE: [PgSslMode; 6] = [
        PgSslMode::Disable,
        PgSslMode::Allow,
        PgSslMode::Prefer,
        PgSslMode::Require,
        PgSslMode::VerifyCa,
        PgSslMode::VerifyFull,
    ];

    #[test]
    fn off_the_machine_only_verify_full_goes_without_the_opt_in() {
        for mode in EVERY_MODE {
            let verified = matches!(mode, PgSslMode::VerifyFull);
            for host in ["db.internal", "10.255.255.1", "0.0.0.0", "localhost.localdomain", "fe80::1"] {
                assert_eq!(unverified_off_machine(host, false, mode), !verified, "{host} {mode:?}");
            }
            for host in ["localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"] {
                assert!(!unverified_off_machine(host, false, mode), "{host} {mode:?}");
            }
            // a Unix socket never leaves the machine
            assert!(!unverified_off_machine("/var/run/postgresql", true, mode), "{mode:?}");
        }
    }

    #[test]
    fn every_server_of_a_url_is_checked_with_the_sslmode_it_says() {
        let exposures = |url: &str| {
            transport_exposures("LEDGER_DATABASE_URL", url)
                .expect("parses")
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        for mode in EVERY_MODE {
            let name = ssl_mode_name(mode);
            assert_eq!(name.parse::<PgSslMode>().map(ssl_mode_name).ok(), Some(name));
            let local =
                format!("postgres://u:pw@localhost:5432,127.0.0.1:5433,[::1]:5434/ledger?sslmode={name}");
            assert!(exposures(&local).is_empty(), "{local}");
            let remote =
                format!("postgres://u:pw@db1.internal,127.0.0.1:5433,10.0.0.2:5434/ledger?sslmode={name}");
            if matches!(mode, PgSslMode::VerifyFull) {
                assert!(exposures(&remote).is_empty(), "{remote}");
            } else {
                assert_eq!(
                    exposures(&remote),
                    [
                        format!(
                            "LEDGER_DATABASE_URL names db1.internal:5432, not a loopback address, and its \
                             sslmode is {name} (verify-full needed, with sslrootcert)"
                        ),
                        format!(
                            "LEDGER_DATABASE_URL names 10.0.0.2:5434, not a loopback address, and its \
                             sslmode is {name} (verify-full needed, with sslrootcert)"
                        ),
                    ],
                    "{remote}"
                );
            }
        }
        // the default sslmode (prefer) may fall back to plaintext
        assert_eq!(exposures("postgres://u@db.internal/ledger").len(), 1);
        // a socket directory as the host, in the authority or as `host=`
        assert!(exposures("postgres://u@%2Fvar%2Frun%2Fpostgresql/ledger").is_empty());
        assert!(exposures("postgres://u@db.internal/ledger?host=/var/run/postgresql").is_empty());
        // `hostaddr` is where it connects
        assert_eq!(exposures("postgres://u@localhost/ledger?hostaddr=10.0.0.3").len(), 1);
        let error = transport_exposures("LEDGER_DATABASE_URL", "ledger.internal/db").expect_err("no scheme");
        assert!(error.to_string().contains("LEDGER_DATABASE_URL"), "{error}");
        assert!(!format!("{:?}", exposures("postgres://u:s3cret@db.internal/ledger")).contains("s3cret"));
    }

    #[test]
    fn the_session_limits_and_keepalives_travel_as_startup_options() {
        let session = Session {
            statement_timeout: Duration::from_millis(2_500),
            lock_timeout: Duration::from_secs(1),
            idle_in_transaction_session_timeout: Duration::ZERO,
        };
        let options = session.apply("postgres://u@h/db".parse().expect("url"));
        assert_eq!(
            options.get_options(),
            Some(
                "-c statement_timeout=2500ms -c lock_timeout=1000ms -c idle_in_transaction_session_timeout=0ms \
                 -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3 \
                 -c tcp_user_timeout=60000ms"
            )
        );
    }
}
