//! A three-node Kafka cluster of the test's own, what its metadata says (who leads, who is in
//! sync), and a network partition of one of its nodes, proven and healed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;

use super::network::{Cut, Network};
use crate::common::system::System;

/// Which node a [`Fault::Partition`] cuts off, chosen when the fault starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Isolated {
    /// The active controller (the KRaft quorum's leader).
    Controller,
    /// Of the other nodes, the one that leads the most partitions: a broker, not the controller.
    Broker,
}

/// A Kafka cluster of three broker+controller nodes of the test's own (`scripts/stack up kafka
/// --brokers 3` with its own state directory and ports), beside the shared stack; stopped and
/// wiped when dropped (and before it starts, should an earlier run have left one behind). With
/// a [`Network`], each node runs in a network namespace of its own, on an address of its own.
pub struct Cluster {
    state: PathBuf,
    base_port: u16,
    pub bootstrap: String,
    /// Dropped after the cluster is stopped (the fields after `Drop::drop`).
    network: Option<Network>,
}

impl Cluster {
    const BASE_PORT: u16 = 19_092;
    const NETNS_BASE_PORT: u16 = 29_092;

    pub async fn up() -> Self {
        let cluster = Self {
            bootstrap: (0..3)
                .map(|n| format!("127.0.0.1:{}", Self::BASE_PORT + 2 * n))
                .collect::<Vec<_>>()
                .join(","),
            state: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-cluster3"),
            base_port: Self::BASE_PORT,
            network: None,
        };
        cluster.stop_and_wipe();
        cluster.stack(&["up", "kafka", "--brokers", "3"]).await;
        cluster
    }

    /// The cluster with each node in a network namespace of its own ([`Network`]).
    pub async fn up_in_namespaces() -> Self {
        let mut cluster = Self {
            bootstrap: (1..=3)
                .map(|n| format!("{}:{}", Network::address(n), Self::NETNS_BASE_PORT as usize + 2 * (n - 1)))
                .collect::<Vec<_>>()
                .join(","),
            state: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-cluster3-netns"),
            base_port: Self::NETNS_BASE_PORT,
            network: None,
        };
        // an earlier run's nodes first (they hold its namespaces), then its namespaces
        cluster.stop_and_wipe();
        cluster.network = Some(Network::create());
        cluster.stack(&["up", "kafka", "--brokers", "3"]).await;
        cluster
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command =
            std::process::Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stack"));
        command
            .args(args)
            .env("PAGAMENTOS_STACK_DIR", &self.state)
            .env("KAFKA_BROKER_PORT", self.base_port.to_string());
        if self.network.is_some() {
            let addresses: Vec<String> = (1..=3).map(Network::address).collect();
            let namespaces: Vec<String> = (1..=3).map(Network::node_namespace).collect();
            command
                .env("KAFKA_NODE_ADDRESSES", addresses.join(","))
                .env("KAFKA_NODE_NETNS", namespaces.join(","));
        }
        command
    }

    /// `scripts/stack <args>` on this cluster.
    pub async fn stack(&self, args: &[&str]) {
        let mut command = self.command(args);
        let status = tokio::task::spawn_blocking(move || command.status())
            .await
            .expect("join")
            .expect("run scripts/stack");
        assert!(status.success(), "scripts/stack {args:?} on the cluster failed");
    }

    fn stop_and_wipe(&self) {
        if let Some(network) = &self.network {
            network.heal_all(); // a node cut off would wait for its controller before stopping
        }
        if self.state.exists() {
            let _ = self.command(&["down", "kafka"]).status();
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }

    /// SIGKILL of node `n` (1–3): no controlled shutdown, as when a machine dies.
    pub async fn kill(&self, n: usize) {
        let pid_file = self.state.join(format!("kafka-cluster/node-{n}/broker.pid"));
        let pid = std::fs::read_to_string(&pid_file).expect("broker.pid");
        let status = Command::new("kill").args(["-KILL", pid.trim()]).status().await.expect("kill");
        assert!(status.success(), "kill -KILL node {n}");
    }

    /// Each node's view of the controller quorum, from its `quorum-state` file: (node, leader,
    /// epoch); leader -1 while a node knows of none.
    fn quorum(&self) -> Vec<(usize, i64, i64)> {
        (1..=3)
            .filter_map(|n| {
                let file =
                    self.state.join(format!("kafka-cluster/node-{n}/data/__cluster_metadata-0/quorum-state"));
                let state: Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
                Some((n, state["leaderId"].as_i64()?, state["leaderEpoch"].as_i64()?))
            })
            .collect()
    }

    /// The quorum's leader as the node of the highest epoch that knows one has it.
    fn quorum_leader(&self) -> Option<(usize, i64)> {
        self.quorum()
            .into_iter()
            .filter(|(_, leader, _)| *leader > 0)
            .max_by_key(|(_, _, epoch)| *epoch)
            .map(|(_, leader, epoch)| (leader as usize, epoch))
    }

    /// The node `isolated` names, cut off from whom `cut` says for `hold`, then healed, all
    /// under the traffic that keeps flowing. Proves the cut real (the other nodes fence the
    /// node: it leads nothing and is in no ISR, and when it was the controller another one is
    /// elected) and waits, up to `recovery`, until the heal is complete (the node back in every ISR); prints what
    /// the cluster did meanwhile, with wall-clock times to match the service logs.
    // Over 100 lines on purpose: the cut, the traffic kept flowing through it, the heal and the
    // proof that the cut held share the cluster's nodes and the running system; they read best as
    // one sequence.
    pub async fn partition(
        &self,
        system: &System,
        isolated: Isolated,
        cut: Cut,
        hold: Duration,
        recovery: Duration,
    ) {
        let network = self.network.as_ref().expect("a partition needs the cluster in network namespaces");
        let watch = Watch::new(&self.bootstrap);
        let before = watch.view(None, Duration::from_secs(60)).await;
        let (leader, epoch) = self.quorum_leader().expect("a controller quorum with a leader");
        let node = match isolated {
            Isolated::Controller => leader,
            Isolated::Broker => (1..=3)
                .filter(|node| *node != leader)
                .max_by_key(|node| before.leads(*node as i32))
                .expect("three nodes"),
        };
        let id = node as i32;
        eprintln!(
            "[partition {}] cutting node {node} off (quorum leader {leader}, epoch {epoch}); before: {}",
            wall_clock(),
            before.summary(id)
        );
        let settled_before = settled(system).await;
        let cut_at = Instant::now();
        let partition = network.cut(node, cut);
        let (mut printed_majority, mut printed_isolated, mut printed_quorum) =
            (String::new(), String::new(), String::new());
        let (mut fenced, mut new_leader, mut settled_at_fence) = (None, None, None);
        let mut progress_at = Duration::ZERO;
        // how long settlements stopped: the longest stretch of the cut in which the settled
        // count did not grow (sampled every 500 ms), and when they first grew after the cut
        let mut stall = Stall::new(settled_before);
        while cut_at.elapsed() < hold {
            let t = cut_at.elapsed().as_secs_f64();
            stall.sample(settled(system).await, cut_at.elapsed());
            if cut_at.elapsed() >= progress_at {
                eprintln!("[partition +{t:>5.1}s] {}", pipeline(system).await);
                progress_at += Duration::from_secs(5);
            }
            if let Some((now, epoch)) = self.quorum_leader() {
                let quorum =
                    format!("quorum leader {now} (epoch {epoch}); (node, leader, epoch) {:?}", self.quorum());
                if quorum != printed_quorum {
                    eprintln!("[partition +{t:>5.1}s] {quorum}");
                    printed_quorum = quorum;
                }
                if now != leader && new_leader.is_none() {
                    new_leader = Some((now, cut_at.elapsed()));
                }
            }
            if let Some(view) = watch.sample().await {
                let summary = view.summary(id);
                // the cut-off node answers (when clients still reach it) from what it last knew
                let printed =
                    if view.answered_by == id { &mut printed_isolated } else { &mut printed_majority };
                if summary != *printed {
                    eprintln!("[partition +{t:>5.1}s] node {}'s answer: {summary}", view.answered_by);
                    *printed = summary;
                }
                if fenced.is_none() && view.answered_by != id && view.leads(id) == 0 && view.in_isr(id) == 0 {
                    fenced = Some(cut_at.elapsed());
                    settled_at_fence = settled(system).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(500).min(hold.saturating_sub(cut_at.elapsed()))).await;
        }
        let fenced = fenced.unwrap_or_else(|| {
            panic!("node {node} cut off for {hold:?}, yet the other nodes never dropped it from leadership and every ISR")
        });
        if node == leader {
            let (now, after) = new_leader.unwrap_or_else(|| {
                panic!("the controller (node {node}) cut off for {hold:?}, yet no other node was elected")
            });
            eprintln!(
                "[partition] node {now} became the controller {:.1}s into the cut",
                after.as_secs_f64()
            );
        }
        let settled_at_heal = settled(system).await;
        stall.sample(settled_at_heal, cut_at.elapsed());
        drop(partition);
        let healed = Instant::now();
        let count = |count: Option<i64>| count.map_or("?".to_owned(), |count| count.to_string());
        eprintln!(
            "[partition {}] healed after {:.1}s; node {node} had left every ISR and leadership {:.1}s into the cut; \
             transfers settled: {} before the cut, {} when it was fenced, {} at the heal",
            wall_clock(),
            cut_at.elapsed().as_secs_f64(),
            fenced.as_secs_f64(),
            count(settled_before),
            count(settled_at_fence),
            count(settled_at_heal),
        );
        eprintln!("[partition] {}", stall.summary(cut_at.elapsed()));
        let after = watch.view(Some(id), recovery).await;
        eprintln!(
            "[partition {}] node {node} back in every ISR {:.1}s after the heal: {}",
            wall_clock(),
            healed.elapsed().as_secs_f64(),
            after.summary(id)
        );
    }
}

/// When settlements stopped and resumed during a cut, from samples of the settled count.
struct Stall {
    last: Option<i64>,
    /// When the count last grew (from the cut; zero until it grows).
    grew_at: Duration,
    /// The first growth after the cut.
    first: Option<Duration>,
    /// The longest stretch without growth: (from, to).
    longest: (Duration, Duration),
}

impl Stall {
    fn new(settled_before: Option<i64>) -> Self {
        Self {
            last: settled_before,
            grew_at: Duration::ZERO,
            first: None,
            longest: (Duration::ZERO, Duration::ZERO),
        }
    }

    fn sample(&mut self, settled: Option<i64>, at: Duration) {
        let Some(now) = settled else { return };
        if self.last.is_some_and(|last| now > last) {
            self.first.get_or_insert(at);
            if at - self.grew_at > self.longest.1 - self.longest.0 {
                self.longest = (self.grew_at, at);
            }
            self.grew_at = at;
        }
        self.last = Some(now);
    }

    /// At the heal (`end` into the cut): a stretch still open then counts up to the heal.
    fn summary(&self, end: Duration) -> String {
        let (from, to) = if end - self.grew_at > self.longest.1 - self.longest.0 {
            (self.grew_at, end)
        } else {
            self.longest
        };
        format!(
            "settlements: longest stop {:.1}s (+{:.1}s to +{:.1}s{}), first settlement after the cut at {}",
            (to - from).as_secs_f64(),
            from.as_secs_f64(),
            to.as_secs_f64(),
            if to == end { ", the heal" } else { "" },
            self.first.map_or("none before the heal".to_owned(), |at| format!("+{:.1}s", at.as_secs_f64())),
        )
    }
}

/// Transfers settled so far, as the API's database has them (`None` while it cannot say).
async fn settled(system: &System) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE status = 'LIQUIDADA'")
        .fetch_one(&system.transfers_db.pool)
        .await
        .ok()
}

/// Where the traffic is, hop by hop: events waiting in each outbox, transfers the ledger
/// decided, transfers settled.
async fn pipeline(system: &System) -> String {
    async fn count(pool: &sqlx::PgPool, sql: &str) -> String {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .map_or("?".to_owned(), |count| count.to_string())
    }
    const UNPUBLISHED: &str = "SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL";
    let (transfers, ledger) = (&system.transfers_db.pool, &system.ledger_db.pool);
    format!(
        "requests unpublished {}, decided by the ledger {}, outcomes unpublished {}, settled {}",
        count(transfers, UNPUBLISHED).await,
        count(ledger, "SELECT count(*) FROM transferencia_processada").await,
        count(ledger, UNPUBLISHED).await,
        count(transfers, "SELECT count(*) FROM transferencia WHERE status = 'LIQUIDADA'").await,
    )
}

/// The time of day (UTC, as the services log it).
fn wall_clock() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let (seconds, millis) = (now.as_secs() % 86_400, now.subsec_millis());
    format!("{:02}:{:02}:{:02}.{millis:03}Z", seconds / 3600, seconds / 60 % 60, seconds % 60)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_and_wipe();
    }
}

/// Watches a cluster's metadata: who leads which partition, who is in its ISR, and which node
/// answered (a node cut off from the others still answers clients, from what it last knew).
struct Watch {
    config: kafka::rdkafka::ClientConfig,
}

/// One metadata answer: every topic's partitions (the internal ones included).
struct View {
    answered_by: i32,
    brokers: Vec<i32>,
    /// (leader, replicas, ISR) of every partition.
    partitions: Vec<(i32, Vec<i32>, Vec<i32>)>,
}

impl View {
    fn leads(&self, node: i32) -> usize {
        self.partitions.iter().filter(|(leader, _, _)| *leader == node).count()
    }

    fn in_isr(&self, node: i32) -> usize {
        self.partitions.iter().filter(|(_, _, isr)| isr.contains(&node)).count()
    }

    fn under_replicated(&self) -> usize {
        self.partitions.iter().filter(|(_, replicas, isr)| isr.len() < replicas.len()).count()
    }

    fn summary(&self, node: i32) -> String {
        let total = self.partitions.len();
        let mut leaders: Vec<String> =
            self.brokers.iter().map(|b| format!("{b}:{}", self.leads(*b))).collect();
        leaders.sort();
        format!(
            "brokers {:?}; leaders per node {}; node {node} in the ISR of {}/{total}; under-replicated {}/{total}; leaderless {}",
            self.brokers,
            leaders.join(" "),
            self.in_isr(node),
            self.under_replicated(),
            self.leads(-1)
        )
    }
}

impl Watch {
    fn new(bootstrap: &str) -> Self {
        let args = kafka::KafkaArgs::new(bootstrap);
        let mut config = kafka::config::base_consumer_settings(&args, "chaos-watch");
        config.set("group.id", testkit::unique("watch"));
        Self { config }
    }

    /// One metadata answer, from a node drawn at random; `None` when none came in 2 s. A fresh
    /// client each time: a client that lives on asks the node it used last (librdkafka prefers
    /// the least idle connection), so a watch that once asked the cut-off node kept asking it
    /// and, when that node still answered clients, saw its stale view for the whole cut.
    async fn sample(&self) -> Option<View> {
        use kafka::rdkafka::consumer::Consumer;
        let config = self.config.clone();
        tokio::task::spawn_blocking(move || {
            let client: kafka::rdkafka::consumer::BaseConsumer<kafka::context::Context> =
                kafka::context::create(&config).expect("metadata client");
            let metadata = client.fetch_metadata(None, Duration::from_secs(2)).ok()?;
            let mut brokers: Vec<i32> = metadata.brokers().iter().map(|broker| broker.id()).collect();
            brokers.sort();
            let partitions = metadata
                .topics()
                .iter()
                .flat_map(|topic| topic.partitions())
                .map(|partition| {
                    (partition.leader(), partition.replicas().to_vec(), partition.isr().to_vec())
                })
                .collect();
            Some(View { answered_by: metadata.orig_broker_id(), brokers, partitions })
        })
        .await
        .expect("metadata task")
    }

    /// The first answer, not from `not_from`, in which all three nodes are registered and
    /// every partition has a leader and all its replicas in sync.
    async fn view(&self, not_from: Option<i32>, within: Duration) -> View {
        let what = "three nodes, every partition led and fully in sync";
        let started = Instant::now();
        loop {
            if let Some(view) = self.sample().await {
                if Some(view.answered_by) != not_from
                    && view.brokers.len() == 3
                    && view.under_replicated() == 0
                    && view.leads(-1) == 0
                    && !view.partitions.is_empty()
                {
                    return view;
                }
            }
            assert!(started.elapsed() < within, "timed out after {within:?} waiting for {what}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
