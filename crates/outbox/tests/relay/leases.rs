//! The relay's leases: a dead relay's rows wait for their lease, a lease that ended and was taken
//! marks nothing, a waiting relay renews its lease, and a relay takes back its own at once.

use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use outbox::relay::{claim, mark, Cycle, Relay, RelayOptions};
use testkit::{eventually, receive};

use crate::helpers::{event_id, fixture, unreachable_producer};

#[tokio::test]
async fn a_dead_relays_rows_are_published_when_its_lease_ends_and_before_later_rows_of_their_key() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let first = fixture.insert("CC-001", r#"{"n":1}"#).await;
    // a relay leases the row and dies without publishing it
    let dead = Uuid::new_v4();
    let lease = Duration::from_secs(10);
    let leased = claim(&fixture.database.pool, dead, 10, lease).await.expect("claim");
    assert_eq!(leased.iter().map(|event| event.id).collect::<Vec<_>>(), vec![first]);
    let lease_end = fixture.lease_end(first).await;
    // more rows come: one behind it on its key, one of another key
    let second = fixture.insert("CC-001", r#"{"n":2}"#).await;
    let other = fixture.insert("CC-002", r#"{"n":3}"#).await;

    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fixture.relay(RelayOptions::fast("test")).run(shutdown.clone()));
    let records = receive(&reader, 3).await;
    let order: Vec<String> = records.iter().map(event_id).collect();
    let position = |id: Uuid| order.iter().position(|seen| *seen == id.to_string()).expect("published");
    assert!(position(first) < position(second), "CC-001 out of order: {order:?}");
    // the broker acknowledges before the relay marks: the marks come a moment after the records
    eventually("nothing pending", testkit::PATIENCE, || async {
        (fixture.pending().await == 0).then_some(())
    })
    .await;
    assert!(fixture.published_at(first).await >= lease_end, "taken before the dead relay's lease ended");
    assert!(fixture.published_at(second).await >= lease_end, "published ahead of its key's leased row");
    assert!(fixture.published_at(other).await < lease_end, "another key waited for the lease");
    shutdown.cancel();
    running.await.expect("relay stops");
}

#[tokio::test]
async fn a_relay_whose_lease_ended_and_was_taken_cannot_mark_the_rows() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let pool = &fixture.database.pool;
    let (slow, next) = (Uuid::new_v4(), Uuid::new_v4());
    // a lease a busy machine cannot outlive between these two statements
    assert_eq!(claim(pool, slow, 10, Duration::from_secs(5)).await.expect("claim").len(), 1);
    assert!(
        claim(pool, next, 10, Duration::from_secs(60)).await.expect("claim").is_empty(),
        "the lease holds"
    );
    eventually("the lease to end and the next relay to take the row", testkit::PATIENCE, || async {
        (!claim(pool, next, 10, Duration::from_secs(60)).await.expect("claim").is_empty()).then_some(())
    })
    .await;
    // the slow relay's late acknowledgement marks nothing: the row belongs to the next relay
    assert_eq!(mark(pool, slow, &[id]).await.expect("mark"), 0);
    assert_eq!(fixture.pending().await, 1);
    assert_eq!(mark(pool, next, &[id]).await.expect("mark"), 1);
    assert_eq!(fixture.pending().await, 0);
}

#[tokio::test]
async fn a_relay_waiting_for_the_broker_keeps_renewing_its_lease() {
    let fixture = fixture(1).await;
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let mut options = RelayOptions::fast("test");
    options.lease = Duration::from_secs(1);
    options.shutdown_grace = Duration::ZERO;
    let relay = Relay::new(fixture.database.pool.clone(), unreachable_producer().await, options);
    let instance = relay.instance();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(relay.run(shutdown.clone()));
    let leased_until = || async {
        sqlx::query_scalar::<_, Option<OffsetDateTime>>(
            "SELECT reservado_ate FROM outbox_evento WHERE id = $1 AND reservado_por = $2",
        )
        .bind(id)
        .bind(instance)
        .fetch_optional(&fixture.database.pool)
        .await
        .expect("lease")
        .flatten()
    };
    let first = eventually("the relay to lease the row", testkit::PATIENCE, leased_until).await;
    // a lease of one second, renewed while the broker does not answer: it moves past its end
    eventually("the lease to be renewed past its first end", testkit::PATIENCE, || async {
        leased_until().await.filter(|until| *until > first + time::Duration::seconds(1))
    })
    .await;
    shutdown.cancel();
    running.await.expect("relay stops");
}

#[tokio::test]
async fn a_relay_takes_back_at_once_the_rows_it_still_leases_from_a_cycle_cut_short() {
    let fixture = fixture(1).await;
    let reader = fixture.reader();
    let id = fixture.insert("CC-001", r#"{"n":1}"#).await;
    let later = fixture.insert("CC-001", r#"{"n":2}"#).await;
    let relay = fixture.relay(RelayOptions::fast("test"));
    // a cycle of this instance leased the first row and lost its connection before the mark
    let leased =
        claim(&fixture.database.pool, relay.instance(), 1, Duration::from_secs(3600)).await.expect("claim");
    assert_eq!(leased.len(), 1);
    let mut connection = fixture.database.pool.acquire().await.expect("connection");
    let cycle = relay.cycle(&mut connection, &CancellationToken::new()).await.expect("cycle");
    assert_eq!(cycle, Cycle { claimed: 2, published: 2 }, "its own lease does not hold the relay back");
    let order: Vec<String> = receive(&reader, 2).await.iter().map(event_id).collect();
    assert_eq!(order, vec![id.to_string(), later.to_string()]);
}
