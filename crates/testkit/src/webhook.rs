//! A real local HTTP receiver for notification tests: it answers each event's calls from a
//! script (status codes, delays) and records every call with its arrival time and headers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

/// How the receiver answers one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Status(u16),
    /// Waits, then answers with the status (longer than the client's timeout: a timeout).
    After(Duration, u16),
}

/// One call the receiver got.
#[derive(Debug, Clone)]
pub struct Call {
    pub idempotency_key: Option<String>,
    /// `X-Signature`.
    pub signature: Option<String>,
    /// Standard Webhooks' `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    pub webhook_id: Option<String>,
    pub webhook_timestamp: Option<String>,
    pub webhook_signature: Option<String>,
    pub event_type: Option<String>,
    pub traceparent: Option<String>,
    pub body: Bytes,
    pub at: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    scripts: HashMap<String, VecDeque<Reply>>,
    fallback: Option<Reply>,
    calls: Vec<Call>,
}

/// The receiver; cheap to clone, all clones share state.
#[derive(Debug, Clone, Default)]
pub struct Receiver {
    inner: Arc<Mutex<Inner>>,
}

impl Receiver {
    /// Serves on a free local port; returns the receiver and its URL. Stops with the runtime.
    pub async fn start() -> (Self, String) {
        let receiver = Self::default();
        let app = Router::new().route("/", post(answer)).with_state(receiver.clone());
        let address = crate::serve_locally(app).await;
        (receiver, format!("http://{address}/"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Calls for event `event_id` are answered with `replies` in order, then 200.
    pub fn script(&self, event_id: impl ToString, replies: &[Reply]) {
        self.lock().scripts.insert(event_id.to_string(), replies.iter().copied().collect());
    }

    /// What unscripted calls get once their script (if any) ran out (default 200).
    pub fn answer_by_default(&self, reply: Reply) {
        self.lock().fallback = Some(reply);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Calls for event `event_id`, in arrival order.
    pub fn calls_for(&self, event_id: impl ToString) -> Vec<Call> {
        let key = event_id.to_string();
        self.lock()
            .calls
            .iter()
            .filter(|call| call.idempotency_key.as_deref() == Some(&key))
            .cloned()
            .collect()
    }
}

async fn answer(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let call = Call {
        idempotency_key: text("idempotency-key"),
        signature: text("x-signature"),
        webhook_id: text("webhook-id"),
        webhook_timestamp: text("webhook-timestamp"),
        webhook_signature: text("webhook-signature"),
        event_type: text("x-evento-tipo"),
        traceparent: text("traceparent"),
        body,
        at: Instant::now(),
    };
    let reply = {
        let mut inner = receiver.lock();
        let key = call.idempotency_key.clone().unwrap_or_default();
        let scripted = inner.scripts.get_mut(&key).and_then(VecDeque::pop_front);
        let reply = scripted.or(inner.fallback).unwrap_or(Reply::Status(200));
        inner.calls.push(call);
        reply
    };
    let status = match reply {
        Reply::Status(status) => status,
        Reply::After(delay, status) => {
            tokio::time::sleep(delay).await;
            status
        }
    };
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}
