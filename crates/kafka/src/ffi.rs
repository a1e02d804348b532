//! The calls into librdkafka that rdkafka does not wrap, behind safe types: a client's main
//! event queue and the events taken from it ([`MainQueue`], [`Event`]), and a producer's main
//! queue with a callback that wakes its delivery thread when an event lands on it
//! ([`ProducerEvents`]). With [`crate::rebootstrap`] (one call, `rd_kafka_brokers_add`), the
//! only `unsafe` code of the workspace: the crate root denies it and allows it on these two
//! modules only; every other crate forbids it.
//!
//! # Invariants (each `SAFETY:` comment says which one it relies on)
//! - A queue handle is a reference of its own to a client's queue (`rd_kafka_queue_get_main`),
//!   released exactly once, by its owner's `Drop`, while the client is still alive: a
//!   [`MainQueue`] borrows the client for its whole life, [`ProducerEvents`] owns the producer
//!   and drops it only after releasing the queue.
//! - An [`Event`] is owned (`rd_kafka_queue_poll`) and destroyed once, by its `Drop`; the
//!   strings it points to live as long as it does and are copied out before it goes.
//! - The callback's argument (an `Arc` held by [`ProducerEvents`]) outlives every call of the
//!   callback: it is switched off before the `Arc` is released, under the queue's lock, which
//!   librdkafka holds while calling it.
//! - librdkafka's queues are thread-safe (every operation takes the queue's lock), so a handle
//!   may be used from any thread.

use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer as _};

use crate::context::Context;

/// A client's main queue (its errors and log lines, a producer's delivery reports), for as long
/// as `'a` borrows the client.
pub(crate) struct MainQueue<'a> {
    queue: *mut rd::rd_kafka_queue_t,
    client: PhantomData<&'a Client<Context>>,
}

impl<'a> MainQueue<'a> {
    /// A reference to `client`'s main queue; `None` if librdkafka gives none.
    pub(crate) fn of(client: &'a Client<Context>) -> Option<Self> {
        // SAFETY: `client.native_ptr()` is the live `rd_kafka_t` that rdkafka's `Client` owns,
        // alive while `'a` borrows it, and so for this handle's whole life. The reference
        // `rd_kafka_queue_get_main` returns (or NULL) is ours, released once by `Drop`.
        let queue = unsafe { rd::rd_kafka_queue_get_main(client.native_ptr()) };
        (!queue.is_null()).then_some(Self { queue, client: PhantomData })
    }

    /// The next event, without waiting; `None` when the queue is empty.
    pub(crate) fn poll_now(&self) -> Option<Event<'_>> {
        // SAFETY: `self.queue` is live until `Drop` (see `of`). With timeout 0
        // `rd_kafka_queue_poll` does not block, and the event it returns (or NULL) is owned by
        // the caller: `Event`'s `Drop` destroys it.
        let event = unsafe { rd::rd_kafka_queue_poll(self.queue, 0) };
        (!event.is_null()).then_some(Event { event, queue: PhantomData })
    }
}

impl Drop for MainQueue<'_> {
    fn drop(&mut self) {
        // SAFETY: the reference `of` took, released once, here; the client is still alive (`'a`)
        // and no `Event` of this queue is left (each borrows the queue).
        unsafe { rd::rd_kafka_queue_destroy(self.queue) }
    }
}

/// One event taken from a [`MainQueue`].
pub(crate) struct Event<'q> {
    event: *mut rd::rd_kafka_event_t,
    queue: PhantomData<&'q ()>,
}

/// What an [`Event`] says, copied out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// An error the client reports (`RD_KAFKA_EVENT_ERROR`).
    Error { code: RDKafkaErrorCode, reason: String },
    /// A log line (`RD_KAFKA_EVENT_LOG`) at syslog `level`.
    Log { level: i32, message: String },
    /// Anything else, which nobody polling the main queue this way expects.
    Other,
}

impl Event<'_> {
    pub(crate) fn kind(&self) -> EventKind {
        // SAFETY: `self.event` is an event we own until `Drop` (see `MainQueue::poll_now`); the
        // strings its accessors return live as long as it does and are copied before this
        // returns (`copied`), and `rd_kafka_event_log` only writes through the three pointers
        // it is given, to locals.
        unsafe {
            match rd::rd_kafka_event_type(self.event) {
                rd::RD_KAFKA_EVENT_ERROR => EventKind::Error {
                    code: RDKafkaErrorCode::from(rd::rd_kafka_event_error(self.event)),
                    reason: copied(rd::rd_kafka_event_error_string(self.event)),
                },
                rd::RD_KAFKA_EVENT_LOG => {
                    let (mut facility, mut message, mut level) = (std::ptr::null(), std::ptr::null(), 0);
                    if rd::rd_kafka_event_log(self.event, &mut facility, &mut message, &mut level) == 0
                        && !message.is_null()
                    {
                        EventKind::Log { level, message: copied(message) }
                    } else {
                        EventKind::Other
                    }
                }
                _ => EventKind::Other,
            }
        }
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: the event `poll_now` handed us, destroyed once, here, after every string of it
        // was copied (`kind` returns owned strings).
        unsafe { rd::rd_kafka_event_destroy(self.event) }
    }
}

/// `text` (a NUL-terminated string, or NULL: empty) as an owned `String`.
///
/// # Safety
/// `text` is NULL or points to a NUL-terminated string alive for the whole call.
unsafe fn copied(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: not NULL, and alive and NUL-terminated as the caller promised.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// Told when an event lands on a [`ProducerEvents`] queue that was empty. Called from one of
/// librdkafka's threads, under the queue's lock: it must not call librdkafka, and must not
/// panic (a panic out of the callback aborts the process).
pub(crate) trait OnEvent: Send + Sync + 'static {
    fn queued(&self);
}

/// A producer, its main queue (where rdkafka's producer polls its delivery reports) and a
/// callback that tells `W` when an event lands on that queue while it is empty. Dropped, it
/// switches the callback off, releases the queue, then lets the producer go (rdkafka's drop
/// purges what is still queued or in flight and serves those reports).
pub(crate) struct ProducerEvents<W: OnEvent> {
    // dropped in this order after `Drop::drop`: nothing, then `on_event`, then the producer
    queue: *mut rd::rd_kafka_queue_t,
    on_event: Arc<W>,
    producer: Arc<BaseProducer<Context>>,
}

// SAFETY: the queue handle is the one field that is not `Send` and `Sync` by itself, and
// librdkafka's queue operations take the queue's lock: `len` may run on any thread while
// another holds `&self` too. The handle is released only by `Drop` (`&mut self`: no one else
// uses it then).
unsafe impl<W: OnEvent> Send for ProducerEvents<W> {}
// SAFETY: as for `Send`.
unsafe impl<W: OnEvent> Sync for ProducerEvents<W> {}

impl<W: OnEvent> ProducerEvents<W> {
    /// Takes a reference to `producer`'s main queue and has `on_event` told of every event
    /// landing on it while it is empty.
    pub(crate) fn new(producer: Arc<BaseProducer<Context>>, on_event: Arc<W>) -> KafkaResult<Self> {
        // SAFETY: `native_ptr` is the live client, kept alive by `producer`, which `Self` keeps
        // until after `Drop` released the reference taken here (or NULL, returned below).
        let queue = unsafe { rd::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        if queue.is_null() {
            return Err(KafkaError::ClientCreation("librdkafka returned no event queue".into()));
        }
        let argument = Arc::as_ptr(&on_event) as *mut c_void;
        // SAFETY: `queue` is live (above). The callback's argument is the `W` that `Self` holds
        // in `on_event` until `Drop` has switched the callback off (see `event_queued`).
        unsafe { rd::rd_kafka_queue_cb_event_enable(queue, Some(event_queued::<W>), argument) };
        Ok(Self { queue, on_event, producer })
    }

    /// Events waiting on the queue.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the handle is live until `Drop`, which no holder of `&self` can overlap, and
        // the length is read under the queue's lock (any thread).
        unsafe { rd::rd_kafka_queue_length(self.queue) }
    }

    pub(crate) fn producer(&self) -> &BaseProducer<Context> {
        &self.producer
    }

    pub(crate) fn on_event(&self) -> &W {
        &self.on_event
    }
}

impl<W: OnEvent> Drop for ProducerEvents<W> {
    fn drop(&mut self) {
        // SAFETY: switching the callback off takes the queue's lock, which librdkafka holds while
        // calling it: once it returns no call is running or will run, so `on_event` may go (it
        // is dropped after this body). The queue reference is then released once, by its only
        // user (`&mut self`), while `producer` (dropped after this body) keeps the client alive.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue, None, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.queue);
        }
    }
}

/// Called by librdkafka, from one of its threads and under the queue's lock, when an event
/// lands on the empty queue: only tells the `W` it was given ([`OnEvent::queued`]).
unsafe extern "C" fn event_queued<W: OnEvent>(_client: *mut rd::rd_kafka_t, argument: *mut c_void) {
    // SAFETY: `argument` is `Arc::as_ptr` of the `W` that `ProducerEvents` holds until its
    // `Drop` has switched this callback off, under the lock librdkafka holds while calling it:
    // the `W` is alive for this whole call. Only `&W` is made (`W: Sync`).
    let on_event = unsafe { &*(argument as *const W) };
    on_event.queued();
}
