//! `pagamentos verify [--scope ledger|all]`: the books against the contract's invariants
//! (`docs/reference/contract.md` §4). The ledger's own invariants (1–3, 5) are set-based queries in
//! [`ledger::verify`]; invariant 4 reads each database through the crate that owns it
//! ([`ledger::verify`], [`transfers::verify`]) and merges the two databases' settled ids and,
//! field by field, their decided transfers (outcome, reason; amount, accounts and currency of a
//! settlement), both read in id order, so memory stays flat however many transfers there are,
//! and reports
//! every transfer still `PENDENTE` after `--pending-older-than`: a request event lost on its
//! way, or a stage down, ends here and not in silence.

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use futures::{Stream, TryStreamExt};
use sqlx::PgPool;
use uuid::Uuid;

use ledger::verify::{Break, CheckResult, LISTED};
use transfers::verify::TransferRow;

use crate::database::{self, DatabaseArgs};

/// What to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scope {
    /// Invariants 1–3 and 5, the ledger database alone.
    Ledger,
    /// Also invariant 4: transfers LIQUIDADA in transferencias iff settled in the ledger, every
    /// decided transfer alike in both databases, none PENDENTE too long.
    All,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// `ledger`: invariants 1–3 and 5; `all`: also 4, which reads the transfers database (run it
    /// once the pipeline is drained: a transfer in flight is reported).
    #[arg(long, value_enum, default_value_t = Scope::All)]
    scope: Scope,

    /// With `all`: a transfer still `PENDENTE` this long after it was accepted is a break
    /// (`300`, `300s`, `5m`, `1h`).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pending_older_than: Duration,

    #[command(flatten)]
    databases: DatabaseArgs,

    #[command(flatten)]
    transport: telemetry::transport::TransportArgs,
}

/// `N`, `Ns`, `Nm` or `Nh`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((at, 's' | 'm' | 'h')) => text.split_at(at),
        _ => (text, "s"),
    };
    let value: u64 =
        number.parse().map_err(|_| format!("{text:?}: a number of seconds, or N followed by s, m or h"))?;
    let seconds = match unit {
        "m" => value.checked_mul(60),
        "h" => value.checked_mul(3_600),
        _ => Some(value),
    };
    seconds.map(Duration::from_secs).ok_or_else(|| format!("{text:?} is too long"))
}

pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let mut databases = vec![("LEDGER_DATABASE_URL", args.databases.ledger_database_url.as_str())];
    if args.scope == Scope::All {
        databases.push(("TRANSFERENCIAS_DATABASE_URL", args.databases.transferencias_database_url.as_str()));
    }
    crate::transport::check("verify", &args.transport, None, &databases)?;
    let ledger_pool = database::connect(&args.databases.ledger_database_url, 2).await?;
    let mut results = ledger::verify::ledger_invariants(&ledger_pool).await?;
    if args.scope == Scope::All {
        let transfers_pool = database::connect(&args.databases.transferencias_database_url, 2).await?;
        results.push(settled_in_both(&transfers_pool, &ledger_pool).await?);
        results.push(decided_alike(&transfers_pool, &ledger_pool).await?);
        results.push(pending_too_long(&transfers_pool, &ledger_pool, args.pending_older_than).await?);
    }
    // in the contract's order: invariant 4's checks before the ledger's invariant 5
    results.sort_by_key(|result| result.invariant);
    print!("{}", report(&results));
    Ok(if results.iter().all(CheckResult::is_clean) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Invariant 4: a transfer is `LIQUIDADA` in `transferencias` iff the ledger settled it.
pub async fn settled_in_both(transfers: &PgPool, ledger_pool: &PgPool) -> anyhow::Result<CheckResult> {
    let in_transfers = transfers::verify::settled_ids(transfers);
    let in_ledger = ledger::verify::settled_transfer_ids(ledger_pool);
    let (total, only_transfers, only_ledger) = merge_differences(in_transfers, in_ledger).await?;

    let mut breaks = Vec::new();
    for id in only_transfers {
        let outcome = ledger::store::outcome(ledger_pool, id).await?;
        let ledger_says = match outcome {
            None => "not decided".to_owned(),
            Some(outcome) => outcome.to_string(),
        };
        breaks.push(Break {
            invariant: 4,
            check: CHECK,
            subject: id.to_string(),
            detail: format!("LIQUIDADA in transferencias, ledger: {ledger_says}"),
        });
    }
    for id in only_ledger {
        let detail = match transfers::verify::status(transfers, id).await? {
            None => "settled by the ledger, unknown to transferencias".to_owned(),
            Some(status) => format!("settled by the ledger, {status} in transferencias"),
        };
        breaks.push(Break { invariant: 4, check: CHECK, subject: id.to_string(), detail });
    }
    breaks.sort_by(|a, b| a.subject.cmp(&b.subject));
    breaks.truncate(LISTED as usize);
    Ok(CheckResult { invariant: 4, check: CHECK, rule: RULE, total, breaks })
}

/// Every transfer still `PENDENTE` more than `bound` after it was accepted, oldest first,
/// with what the ledger knows of it.
pub async fn pending_too_long(
    transfers: &PgPool,
    ledger_pool: &PgPool,
    bound: Duration,
) -> anyhow::Result<CheckResult> {
    let (total, listed) = transfers::verify::pending_older_than(transfers, bound, LISTED).await?;
    let mut breaks = Vec::with_capacity(listed.len());
    for (id, age_s) in listed {
        let ledger_says = match ledger::store::outcome(ledger_pool, id).await? {
            None => "not decided by the ledger".to_owned(),
            Some(outcome) => {
                format!("{outcome} in the ledger: its outcome event did not reach transferencias")
            }
        };
        breaks.push(Break {
            invariant: 4,
            check: PENDING_CHECK,
            subject: id.to_string(),
            detail: format!("PENDENTE for {age_s} s, {ledger_says}"),
        });
    }
    Ok(CheckResult { invariant: 4, check: PENDING_CHECK, rule: PENDING_RULE, total, breaks })
}

/// Invariant 4, field by field: every transfer decided in `transferencias` and in the ledger
/// has the same outcome (and rejection reason) in both, and a settled one moved exactly its
/// amount, from its source to its destination, in its currency. A rejection decided on one
/// side only is a break too (a settlement on one side only is `settled-in-both`'s); a
/// transfer still `PENDENTE` whose outcome the ledger has is in flight (`pending-too-long`
/// catches it if it stays). Both sides are read in id order and merged, memory stays flat.
pub async fn decided_alike(transfers: &PgPool, ledger_pool: &PgPool) -> anyhow::Result<CheckResult> {
    let in_transfers = transfers::verify::transfers(transfers);
    let in_ledger = ledger::verify::decisions(ledger_pool);
    let mut total = 0i64;
    let mut breaks = Vec::new();
    merge_join(
        in_transfers,
        |row| row.id,
        in_ledger,
        |decision| decision.transfer_id,
        |transfer, decision| {
            let Some((subject, detail)) = disagreement(transfer.as_ref(), decision.as_ref()) else { return };
            total += 1;
            if breaks.len() < LISTED as usize {
                breaks.push(Break {
                    invariant: 4,
                    check: DECIDED_CHECK,
                    subject: subject.to_string(),
                    detail,
                });
            }
        },
    )
    .await?;
    Ok(CheckResult { invariant: 4, check: DECIDED_CHECK, rule: DECIDED_RULE, total, breaks })
}

/// What differs between the two databases' views of one transfer (`None`: they agree, or
/// the difference is another check's or in flight).
fn disagreement(
    transfer: Option<&TransferRow>,
    decision: Option<&ledger::verify::Decision>,
) -> Option<(Uuid, String)> {
    let outcome = |result: &str, reason: Option<&str>| match reason {
        Some(reason) => format!("{result} ({reason})"),
        None => result.to_owned(),
    };
    match (transfer, decision) {
        (None, None) => None,
        // blocked by antifraude: decided before the ledger, which never hears of it
        (Some(transfer), None)
            if transfer.rejection_reason.as_deref()
                == Some(contracts::events::RejectionReason::BlockedByAntifraud.as_str()) =>
        {
            None
        }
        // settled on one side only: settled-in-both names it
        (Some(transfer), None) if transfer.status == "REJEITADA" => Some((
            transfer.id,
            format!(
                "{} in transferencias, not decided by the ledger",
                outcome(&transfer.status, transfer.rejection_reason.as_deref())
            ),
        )),
        (None, Some(decision)) if decision.result != "LIQUIDADA" => Some((
            decision.transfer_id,
            format!(
                "{} in the ledger, unknown to transferencias",
                outcome(&decision.result, decision.reason.as_deref())
            ),
        )),
        (Some(_), None) | (None, Some(_)) => None,
        // in flight: the outcome event has not been projected yet
        (Some(transfer), Some(_)) if transfer.status == "PENDENTE" => None,
        (Some(transfer), Some(decision)) => {
            let mut differences = Vec::new();
            if transfer.status != decision.result || transfer.rejection_reason != decision.reason {
                differences.push(format!(
                    "outcome {} in transferencias, {} in the ledger",
                    outcome(&transfer.status, transfer.rejection_reason.as_deref()),
                    outcome(&decision.result, decision.reason.as_deref())
                ));
            }
            if decision.result == "LIQUIDADA" {
                let mut field = |name: &str, here: String, there: Option<String>| {
                    let there = there.unwrap_or_else(|| "none".to_owned());
                    if here != there {
                        differences.push(format!("{name} {here} in transferencias, {there} in the ledger"));
                    }
                };
                field(
                    "amount",
                    transfer.amount_cents.to_string(),
                    decision.amount_cents.map(|a| a.to_string()),
                );
                field("source", transfer.source_account.clone(), decision.source.clone());
                field("destination", transfer.destination_account.clone(), decision.destination.clone());
                field("currency", transfer.currency.clone(), decision.currency.clone());
            }
            (!differences.is_empty()).then(|| (transfer.id, differences.join("; ")))
        }
    }
}

/// Walks two id-ordered streams together, calling `visit` once per id with what each side
/// has of it.
async fn merge_join<L, R, E>(
    left: impl Stream<Item = Result<L, E>>,
    left_id: impl Fn(&L) -> Uuid,
    right: impl Stream<Item = Result<R, E>>,
    right_id: impl Fn(&R) -> Uuid,
    mut visit: impl FnMut(Option<L>, Option<R>),
) -> Result<(), E> {
    let mut left = std::pin::pin!(left);
    let mut right = std::pin::pin!(right);
    let (mut a, mut b) = (left.try_next().await?, right.try_next().await?);
    loop {
        let order = match (&a, &b) {
            (None, None) => return Ok(()),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(x), Some(y)) => left_id(x).cmp(&right_id(y)),
        };
        match order {
            Ordering::Equal => {
                visit(a, b);
                a = left.try_next().await?;
                b = right.try_next().await?;
            }
            Ordering::Less => {
                visit(a, None);
                a = left.try_next().await?;
            }
            Ordering::Greater => {
                visit(None, b);
                b = right.try_next().await?;
            }
        }
    }
}

const DECIDED_CHECK: &str = "decided-alike";
const DECIDED_RULE: &str = "a decided transfer has the same outcome in both databases, and a settled one \
     the same amount, accounts and currency as its entries";

const PENDING_CHECK: &str = "pending-too-long";
const PENDING_RULE: &str =
    "no transfer stays PENDENTE longer than --pending-older-than (a lost event or a stage down)";

const CHECK: &str = "settled-in-both";
const RULE: &str = "a transfer is LIQUIDADA in transferencias iff the ledger settled it";

/// Walks two id-ordered streams together: how many ids are in one only, and the first
/// [`LISTED`] of each side.
async fn merge_differences<E>(
    left: impl Stream<Item = Result<Uuid, E>>,
    right: impl Stream<Item = Result<Uuid, E>>,
) -> Result<(i64, Vec<Uuid>, Vec<Uuid>), E> {
    let mut left = std::pin::pin!(left);
    let mut right = std::pin::pin!(right);
    let (mut total, mut only_left, mut only_right) = (0i64, Vec::new(), Vec::new());
    let mut note = |list: &mut Vec<Uuid>, id: Uuid| {
        total += 1;
        if list.len() < LISTED as usize {
            list.push(id);
        }
    };
    let (mut a, mut b) = (left.try_next().await?, right.try_next().await?);
    loop {
        match (a, b) {
            (None, None) => break,
            (Some(x), None) => {
                note(&mut only_left, x);
                a = left.try_next().await?;
            }
            (None, Some(y)) => {
                note(&mut only_right, y);
                b = right.try_next().await?;
            }
            (Some(x), Some(y)) => match x.cmp(&y) {
                Ordering::Equal => {
                    a = left.try_next().await?;
                    b = right.try_next().await?;
                }
                Ordering::Less => {
                    note(&mut only_left, x);
                    a = left.try_next().await?;
                }
                Ordering::Greater => {
                    note(&mut only_right, y);
                    b = right.try_next().await?;
                }
            },
        }
    }
    Ok((total, only_left, only_right))
}

/// The report: one line per check, the listed breaks under a broken one, a summary last.
pub fn report(results: &[CheckResult]) -> String {
    let mut out = String::new();
    for result in results {
        let verdict = if result.is_clean() { "ok   " } else { "BROKEN" };
        let _ = writeln!(out, "{verdict} invariant {} {}: {}", result.invariant, result.check, result.rule);
        for item in &result.breaks {
            let _ = writeln!(out, "         {}: {}", item.subject, item.detail);
        }
        let unlisted = result.total - result.breaks.len() as i64;
        if unlisted > 0 {
            let _ = writeln!(out, "         … and {unlisted} more");
        }
    }
    let broken: Vec<&CheckResult> = results.iter().filter(|result| !result.is_clean()).collect();
    if broken.is_empty() {
        let _ = writeln!(out, "verify: clean ({} checks)", results.len());
    } else {
        let breaks: i64 = broken.iter().map(|result| result.total).sum();
        let _ = writeln!(out, "verify: {breaks} breaks in {} of {} checks", broken.len(), results.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(values: &[u128]) -> Vec<Uuid> {
        values.iter().map(|value| Uuid::from_u128(*value)).collect()
    }

    async fn merged(left: &[u128], right: &[u128]) -> (i64, Vec<Uuid>, Vec<Uuid>) {
        let stream = |values: Vec<Uuid>| {
            futures::stream::iter(values.into_iter().map(Ok::<_, std::convert::Infallible>))
        };
        merge_differences(stream(ids(left)), stream(ids(right))).await.unwrap()
    }

    #[test]
    fn durations_take_seconds_minutes_or_hours() {
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7_200)));
        for bad in ["", "m", "5 m", "-1", "1.5h", "5d", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn merge_finds_what_one_side_lacks() {
        assert_eq!(merged(&[1, 2, 3], &[1, 2, 3]).await, (0, vec![], vec![]));
        assert_eq!(merged(&[1, 3, 5], &[2, 3, 6]).await, (4, ids(&[1, 5]), ids(&[2, 6])));
        assert_eq!(merged(&[], &[7]).await, (1, vec![], ids(&[7])));
        assert_eq!(merged(&[7, 8], &[]).await, (2, ids(&[7, 8]), vec![]));
    }

    #[tokio::test]
    async fn merge_counts_past_the_listed_ones() {
        let many: Vec<u128> = (0..100).collect();
        let (total, left, right) = merged(&many, &[]).await;
        assert_eq!((total, left.len(), right.len()), (100, LISTED as usize, 0));
    }

    #[test]
    fn report_names_breaks_and_counts_the_rest() {
        let results = vec![
            CheckResult { invariant: 1, check: "a", rule: "rule a", total: 0, breaks: vec![] },
            CheckResult {
                invariant: 2,
                check: "b",
                rule: "rule b",
                total: 3,
                breaks: vec![Break {
                    invariant: 2,
                    check: "b",
                    subject: "conta-1".into(),
                    detail: "off by 1".into(),
                }],
            },
        ];
        let text = report(&results);
        assert!(text.contains("ok    invariant 1 a: rule a"), "{text}");
        assert!(text.contains("BROKEN invariant 2 b: rule b"), "{text}");
        assert!(text.contains("conta-1: off by 1"), "{text}");
        assert!(text.contains("… and 2 more"), "{text}");
        assert!(text.ends_with("verify: 3 breaks in 1 of 2 checks\n"), "{text}");
        assert!(report(&results[..1]).ends_with("verify: clean (1 checks)\n"));
    }
}
