//! `pagamentos loadgen` (`docs/reference/contract.md` §1): creates and funds accounts through the ledger's API,
//! sends one probe transfer and waits for its outcome (not counted), then sends transfers through the transfers API on an **open-loop** schedule (request *i* is due at
//! `start + i/rate`; its latency counts from then, so a stalled system cannot hide its stall by
//! slowing the generator down), learns each transfer's final status from the outcome topics,
//! checks the API agrees, and reports the contract's JSON object.
//!
//! # Layout
//! - [`args`]: the command line.
//! - [`draw`]: accounts (uniform or Zipf) and amounts of each transfer.
//! - [`api`]: the HTTP calls.
//! - [`outcomes`]: the reader of `transferencias.liquidada` / `.rejeitada`.
//! - [`report`]: latencies (HdrHistogram) and the result object.

#![forbid(unsafe_code)]

pub mod api;
pub mod args;
pub mod draw;
pub mod outcomes;
pub mod report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use contracts::Cents;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

pub use args::{LoadgenArgs, Skew};
pub use report::{LatencySummary, Report};

use api::{Api, Sent};
use draw::{Draw, Pick};
use outcomes::{Outcome, OutcomeReader};
use report::Latencies;

/// Accounts created at once.
const ACCOUNT_CONCURRENCY: usize = 32;
/// Pending-list requests at once in the final check.
const CHECK_CONCURRENCY: usize = 16;
/// How long a closed-loop sender waits after a refused request.
const REFUSED_PAUSE: Duration = Duration::from_millis(50);
/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error("could not {what}: {detail}")]
    Http { what: String, detail: String },
    #[error("Kafka: could not {what}: {detail}")]
    Kafka { what: &'static str, detail: String },
    #[error("the result collector failed: {0}")]
    Task(String),
    #[error("{0}")]
    Arguments(String),
}

/// Opening balance of account `index`: `hot-debit`'s hot account gets `accounts` times the
/// others' (as much as all of them together), since every transfer of the run draws on it alone.
fn opening_balance(args: &LoadgenArgs, index: u32) -> Result<Cents, LoadgenError> {
    if args.skew.hot_debit_account() != Some(index) {
        return Ok(args.opening_balance_cents);
    }
    args.opening_balance_cents.get().checked_mul(i64::from(args.accounts)).map(Cents::new).ok_or_else(|| {
        LoadgenError::Arguments(format!(
            "--skew hot-debit opens its hot account with --opening-balance-cents × --accounts, and {} × {} overflows: lower one of them",
            args.opening_balance_cents, args.accounts
        ))
    })
}

/// What a sender learnt about one request.
#[derive(Debug)]
enum Answer {
    /// `done` (closed loop) fires when the transfer's final status is seen.
    Accepted {
        id: Uuid,
        due: Instant,
        done: Option<oneshot::Sender<()>>,
    },
    Refused(String),
}

/// Counts kept while the run goes on.
#[derive(Debug, Default)]
struct Tally {
    /// Accepted, final status not seen yet: when each was due.
    waiting: HashMap<Uuid, Instant>,
    /// Outcomes seen before the `202` came back (or of transfers that are not ours).
    early: HashMap<Uuid, Outcome>,
    /// Accepted and final: settled or not.
    finals: HashMap<Uuid, bool>,
    /// Closed-loop senders waiting for their transfer to finish.
    done: HashMap<Uuid, oneshot::Sender<()>>,
    accepted: u64,
    settled: u64,
    rejected: u64,
    refused: BTreeMap<String, u64>,
    repeated_outcomes: u64,
    conflicting_outcomes: u64,
    latencies: Latencies,
    last_final: Option<Instant>,
}

impl Tally {
    fn answer(&mut self, answer: Answer) {
        match answer {
            Answer::Accepted { id, due, done } => {
                self.accepted += 1;
                if let Some(done) = done {
                    self.done.insert(id, done);
                }
                match self.early.remove(&id) {
                    Some(outcome) => self.finish(outcome, due),
                    None => {
                        self.waiting.insert(id, due);
                    }
                }
            }
            Answer::Refused(reason) => *self.refused.entry(reason).or_default() += 1,
        }
    }

    fn outcome(&mut self, outcome: Outcome) {
        if let Some(&settled) = self.finals.get(&outcome.transfer_id) {
            // the relay is at-least-once: a repeat is expected now and then; a different
            // outcome for the same transfer would be a real fault
            if settled == outcome.settled {
                self.repeated_outcomes += 1;
            } else {
                self.conflicting_outcomes += 1;
            }
            return;
        }
        match self.waiting.remove(&outcome.transfer_id) {
            Some(due) => self.finish(outcome, due),
            None => {
                self.early.insert(outcome.transfer_id, outcome);
            }
        }
    }

    fn finish(&mut self, outcome: Outcome, due: Instant) {
        self.finals.insert(outcome.transfer_id, outcome.settled);
        if let Some(done) = self.done.remove(&outcome.transfer_id) {
            let _ = done.send(());
        }
        if outcome.settled {
            self.settled += 1;
        } else {
            self.rejected += 1;
        }
        self.latencies.record(outcome.seen.saturating_duration_since(due));
        self.last_final = Some(self.last_final.map_or(outcome.seen, |last| last.max(outcome.seen)));
    }

    fn refused(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// Runs the load and returns its report. `stop` (ctrl-c) ends the sending early; what was
/// accepted is still waited for.
// Over 100 lines on purpose: set-up, sending, draining and the report share the run's counters,
// clocks and stop token, and read best as one sequence.
pub async fn run(args: LoadgenArgs, stop: CancellationToken) -> Result<Report, LoadgenError> {
    let run_id = format!("{:06x}", rand::random::<u32>() & 0x00ff_ffff);
    let seed = args.seed.unwrap_or_else(rand::random);
    let api = Arc::new(Api::new(
        &args.transferencias_url,
        &args.ledger_url,
        args.api_token.clone(),
        args.admin_token.clone(),
        args.concurrency as usize,
    )?);
    let balances: Vec<Cents> =
        (0..args.accounts).map(|n| opening_balance(&args, n)).collect::<Result<_, _>>()?;
    api.ready().await?;

    let accounts: Arc<Vec<String>> =
        Arc::new((0..args.accounts).map(|n| format!("LG{run_id}-{n}")).collect());
    eprintln!(
        "loadgen: run {run_id}, seed {seed}: opening {} accounts with {} cents each",
        accounts.len(),
        args.opening_balance_cents
    );
    if let Some(hot) = args.skew.hot_debit_account() {
        eprintln!(
            "loadgen: the hot account {} opens with {} cents",
            accounts[hot as usize], balances[hot as usize]
        );
    }
    let mut opening =
        futures::stream::iter(accounts.iter().zip(&balances).map(|(id, &cents)| api.open_account(id, cents)))
            .buffer_unordered(ACCOUNT_CONCURRENCY);
    while let Some(result) = opening.next().await {
        result?;
    }
    drop(opening);

    let reader = OutcomeReader::open(&args.kafka, &run_id).await?;
    let (outcome_sink, mut outcomes) = mpsc::unbounded_channel();
    let reader_stop = CancellationToken::new();
    let reader_task = tokio::spawn(reader.run(outcome_sink, reader_stop.clone()));
    probe(&api, &accounts, &mut outcomes, Duration::from_secs(args.drain_timeout)).await;

    let rate = if args.rate == 0 {
        "closed loop (each sender's next transfer once its last is final)".to_owned()
    } else {
        format!("{}/s", args.rate)
    };
    eprintln!(
        "loadgen: sending {rate} for {} s over {} accounts ({}), up to {} in flight",
        args.duration, args.accounts, args.skew, args.concurrency
    );
    let started = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let (answer_sink, answers) = mpsc::unbounded_channel();
    let (done_sending, sending_done) = watch::channel(false);
    let drain = Duration::from_secs(args.drain_timeout);
    let collector = tokio::spawn(collect(answers, outcomes, sending_done, sent.clone(), started, drain));

    let draw = Draw::new(args.accounts, args.skew, args.max_amount_cents);
    let senders =
        Senders { api: api.clone(), accounts: accounts.clone(), sent: sent.clone(), answers: answer_sink };
    let end = started + Duration::from_secs(args.duration);
    if args.rate == 0 {
        senders.closed_loop(&draw, seed, args.concurrency, end, &stop).await;
    } else {
        senders.open_loop(&draw, seed, args.rate, args.duration, args.concurrency, &stop).await;
    }
    let sending_took = started.elapsed();
    // every answer is in the channel now; dropping the last sender handle closes it
    drop(senders);
    let _ = done_sending.send(true);
    let tally = collector.await.map_err(|error| LoadgenError::Task(error.to_string()))?;
    reader_stop.cancel();
    let _ = reader_task.await;

    // The outcome topics say final; the API must say so too (the projection may trail a little).
    let still_pending = api_pending(&api, &accounts, &tally.finals, started + sending_took + drain).await?;
    let lost = tally.waiting.len() as u64 + still_pending;

    let sent = sent.load(Ordering::Relaxed);
    let finals = tally.settled + tally.rejected;
    let span = tally.last_final.map_or(Duration::ZERO, |last| last.saturating_duration_since(started));
    let throughput_per_s =
        if span.is_zero() { 0.0 } else { (finals as f64 / span.as_secs_f64() * 10.0).round() / 10.0 };
    for (reason, count) in &tally.refused {
        eprintln!("loadgen: refused {count} × {reason}");
    }
    if tally.repeated_outcomes > 0 {
        eprintln!(
            "loadgen: {} outcome events seen twice (redelivery; counted once)",
            tally.repeated_outcomes
        );
    }
    if tally.conflicting_outcomes > 0 {
        eprintln!(
            "loadgen: {} transfers with BOTH a settlement and a rejection event",
            tally.conflicting_outcomes
        );
    }
    if lost > 0 {
        eprintln!(
            "loadgen: LOST {lost}: {} never reached an outcome topic within {} s, {still_pending} final on Kafka but PENDENTE in the API",
            tally.waiting.len(),
            args.drain_timeout
        );
    }
    eprintln!(
        "loadgen: sent {sent} in {:.1} s ({:.1}/s offered), accepted {}, refused {}, final {finals} ({} settled, {} rejected)",
        sending_took.as_secs_f64(),
        sent as f64 / sending_took.as_secs_f64().max(0.001),
        tally.accepted,
        tally.refused(),
        tally.settled,
        tally.rejected
    );
    Ok(Report {
        sent,
        accepted: tally.accepted,
        settled: tally.settled,
        rejected: tally.rejected,
        lost,
        throughput_per_s,
        latency_ms: tally.latencies.summary(),
        conflicting: tally.conflicting_outcomes,
    })
}

/// Sends one transfer (1 cent, the first account to the second) and waits for its outcome on
/// the reader, at most `timeout`: the load starts once the reader's fetches are established and
/// the chain has carried a transfer. Without it the first transfers of a load waited for the
/// new reader's first fetches: in dev runs of 7c70725 the maximum of a 200/s load (503 ms) and
/// of a 25/s load (185 ms) both fell in the load's first second. Not counted in the report;
/// a probe that is refused or not final in time is reported on stderr and the load goes on
/// (a system that finishes nothing is reported as losing the load's transfers, as before).
async fn probe(
    api: &Api,
    accounts: &[String],
    outcomes: &mut mpsc::UnboundedReceiver<outcomes::Outcome>,
    timeout: Duration,
) {
    let probe = match api.transfer(&accounts[0], &accounts[1], contracts::Amount::ONE_CENT).await {
        Sent::Accepted(id) => id,
        Sent::Refused(reason) => {
            eprintln!("loadgen: the probe transfer was refused ({reason}); sending anyway");
            return;
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, outcomes.recv()).await {
            Ok(Some(outcome)) if outcome.transfer_id == probe => return,
            Ok(Some(_)) => {}   // another run's, or a redelivery: not ours
            Ok(None) => return, // the reader stopped: the load's report will say what it saw
            Err(_) => {
                eprintln!(
                    "loadgen: the probe transfer {probe} was not final within {} s; sending anyway",
                    timeout.as_secs()
                );
                return;
            }
        }
    }
}

/// Keeps the tally and prints progress until sending is over and every accepted transfer is
/// final, or the drain deadline passes.
async fn collect(
    mut answers: mpsc::UnboundedReceiver<Answer>,
    mut outcomes: mpsc::UnboundedReceiver<Outcome>,
    mut sending_done: watch::Receiver<bool>,
    sent: Arc<AtomicU64>,
    started: Instant,
    drain: Duration,
) -> Tally {
    let mut tally = Tally::default();
    let mut progress = tokio::time::interval_at((started + PROGRESS_EVERY).into(), PROGRESS_EVERY);
    let mut deadline: Option<Instant> = None;
    let mut answers_open = true;
    loop {
        if deadline.is_some() && !answers_open && tally.waiting.is_empty() {
            break;
        }
        let until = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            answer = answers.recv(), if answers_open => match answer {
                Some(answer) => tally.answer(answer),
                None => answers_open = false,
            },
            Some(outcome) = outcomes.recv() => tally.outcome(outcome),
            Ok(()) = sending_done.changed(), if deadline.is_none() => {
                if *sending_done.borrow() {
                    deadline = Some(Instant::now() + drain);
                }
            }
            _ = progress.tick() => {
                let sent = sent.load(Ordering::Relaxed);
                let in_flight = sent.saturating_sub(tally.accepted + tally.refused());
                eprintln!(
                    "loadgen: {:>6.1}s sent {sent} accepted {} final {} waiting {} in flight {in_flight} p99 {:.1} ms",
                    started.elapsed().as_secs_f64(),
                    tally.accepted,
                    tally.finals.len(),
                    tally.waiting.len(),
                    tally.latencies.quantile_ms(0.99),
                );
            }
            () = tokio::time::sleep_until(until.into()) => break,
        }
    }
    tally
}

/// Counts accepted-and-final transfers the API still shows `PENDENTE`, asking again until there
/// are none or `deadline` passes (at least once, and for at least 10 s).
async fn api_pending(
    api: &Api,
    accounts: &[String],
    finals: &HashMap<Uuid, bool>,
    deadline: Instant,
) -> Result<u64, LoadgenError> {
    let deadline = deadline.max(Instant::now() + Duration::from_secs(10));
    loop {
        let mut lists = futures::stream::iter(accounts.iter().map(|account| api.pending(account)))
            .buffer_unordered(CHECK_CONCURRENCY);
        let mut ours: HashSet<Uuid> = HashSet::new();
        while let Some(list) = lists.next().await {
            ours.extend(list?.into_iter().filter(|id| finals.contains_key(id)));
        }
        if ours.is_empty() || Instant::now() >= deadline {
            return Ok(ours.len() as u64);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What every sender shares.
#[derive(Clone)]
struct Senders {
    api: Arc<Api>,
    accounts: Arc<Vec<String>>,
    sent: Arc<AtomicU64>,
    answers: mpsc::UnboundedSender<Answer>,
}

impl Senders {
    /// Request `i` is due at `i / rate` seconds; a request that cannot start on time (all
    /// `concurrency` slots busy) still counts its latency from when it was due.
    async fn open_loop(
        &self,
        draw: &Draw,
        seed: u64,
        rate: u32,
        duration: u64,
        concurrency: u32,
        stop: &CancellationToken,
    ) {
        let total = u64::from(rate) * duration;
        let started = Instant::now();
        let slots = Arc::new(Semaphore::new(concurrency as usize));
        let tracker = TaskTracker::new();
        let mut rng = StdRng::seed_from_u64(seed);
        for i in 0..total {
            let due = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep_until(due.into()) => {}
            }
            let slot = tokio::select! {
                () = stop.cancelled() => break,
                slot = slots.clone().acquire_owned() => slot,
            };
            let Ok(slot) = slot else { break };
            let pick = draw.next(&mut rng);
            let request = self.request(pick, due, None);
            tracker.spawn(async move {
                request.await;
                drop(slot);
            });
        }
        tracker.close();
        tracker.wait().await;
    }

    /// `concurrency` senders, each sending its next transfer once its last one is final: the
    /// system's end-to-end capacity with a bounded number of transfers in flight, nothing
    /// piling up in a queue. A refused request is retried after a short pause.
    async fn closed_loop(
        &self,
        draw: &Draw,
        seed: u64,
        concurrency: u32,
        end: Instant,
        stop: &CancellationToken,
    ) {
        let tracker = TaskTracker::new();
        for worker in 0..concurrency {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(u64::from(worker)));
            let draw = draw.clone();
            let stop = stop.clone();
            let this = self.clone();
            tracker.spawn(async move {
                while Instant::now() < end && !stop.is_cancelled() {
                    let pick = draw.next(&mut rng);
                    let (done, finished) = oneshot::channel();
                    if this.request(pick, Instant::now(), Some(done)).await {
                        tokio::select! {
                            _ = finished => {}
                            () = tokio::time::sleep_until(end.into()) => {}
                            () = stop.cancelled() => {}
                        }
                    } else {
                        tokio::time::sleep(REFUSED_PAUSE).await;
                    }
                }
            });
        }
        tracker.close();
        tracker.wait().await;
    }

    /// One POST; its answer goes to the collector. True when accepted.
    fn request(
        &self,
        pick: Pick,
        due: Instant,
        done: Option<oneshot::Sender<()>>,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let api = self.api.clone();
        let accounts = self.accounts.clone();
        let sent = self.sent.clone();
        let answers = self.answers.clone();
        async move {
            sent.fetch_add(1, Ordering::Relaxed);
            let answer = match api
                .transfer(
                    &accounts[pick.source as usize],
                    &accounts[pick.destination as usize],
                    pick.amount_cents,
                )
                .await
            {
                Sent::Accepted(id) => Answer::Accepted { id, due, done },
                Sent::Refused(reason) => Answer::Refused(reason),
            };
            let accepted = matches!(answer, Answer::Accepted { .. });
            let _ = answers.send(answer);
            accepted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(id: Uuid, settled: bool, seen: Instant) -> Outcome {
        Outcome { transfer_id: id, settled, seen }
    }

    #[test]
    fn outcomes_before_or_after_the_answer_count_once_from_when_due() {
        let mut tally = Tally::default();
        let due = Instant::now();
        let (a, b, foreign) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        // a: answered, then final 20 ms after it was due
        tally.answer(Answer::Accepted { id: a, due, done: None });
        tally.outcome(outcome(a, true, due + Duration::from_millis(20)));
        // b: final seen before its 202 arrived
        tally.outcome(outcome(b, false, due + Duration::from_millis(5)));
        tally.answer(Answer::Accepted { id: b, due, done: None });
        // another system's transfer: never counted
        tally.outcome(outcome(foreign, true, due));
        // a repeat and a contradiction
        tally.outcome(outcome(a, true, due + Duration::from_millis(30)));
        tally.outcome(outcome(b, true, due + Duration::from_millis(30)));
        tally.answer(Answer::Refused("503 Service unavailable".into()));

        assert_eq!((tally.accepted, tally.settled, tally.rejected), (2, 1, 1));
        assert!(tally.waiting.is_empty());
        assert_eq!(tally.finals.len(), 2);
        assert_eq!((tally.repeated_outcomes, tally.conflicting_outcomes), (1, 1));
        assert_eq!(tally.refused(), 1);
        assert_eq!(tally.latencies.len(), 2);
        assert!((tally.latencies.summary().max - 20.0).abs() < 0.1);
        assert_eq!(tally.last_final, Some(due + Duration::from_millis(20)));
    }

    #[test]
    fn only_the_hot_debit_account_opens_with_everyone_s_balance() {
        use clap::Parser;
        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            args: LoadgenArgs,
        }
        let args = |skew: &str, balance: &str| {
            Command::parse_from([
                "loadgen",
                "--accounts",
                "1000",
                "--skew",
                skew,
                "--opening-balance-cents",
                balance,
            ])
            .args
        };
        let hot = args("hot-debit", "100");
        assert_eq!(opening_balance(&hot, 0).expect("hot").get(), 100_000);
        assert_eq!(opening_balance(&hot, 1).expect("cold").get(), 100);
        let credit = args("hot-credit", "100");
        assert_eq!(opening_balance(&credit, 0).expect("credited").get(), 100);
        let huge = args("hot-debit", &(i64::MAX / 10).to_string());
        assert!(matches!(opening_balance(&huge, 0), Err(LoadgenError::Arguments(_))));
        assert_eq!(opening_balance(&huge, 1).expect("cold").get(), i64::MAX / 10);
    }

    #[test]
    fn an_accepted_transfer_without_outcome_stays_waiting() {
        let mut tally = Tally::default();
        tally.answer(Answer::Accepted { id: Uuid::new_v4(), due: Instant::now(), done: None });
        assert_eq!(tally.waiting.len(), 1);
        assert_eq!(tally.settled + tally.rejected, 0);
    }
}
