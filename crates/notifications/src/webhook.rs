//! The webhook client: one `POST` per outcome event to `NOTIFICACOES_WEBHOOK_URL`
//! (`docs/reference/contract.md` §3, *Notifications*), with a bounded timeout and a pooled connection.
//!
//! The request carries the event's JSON exactly as it travelled on Kafka, `Idempotency-Key:
//! <eventoId>` (receivers dedupe by it: every delivery is at least once), `X-Evento-Tipo`, the
//! W3C `traceparent` of the delivery, and, signed with `NOTIFICACOES_WEBHOOK_SECRET`, the
//! Standard Webhooks headers (`webhook-id: <eventoId>`, `webhook-timestamp: <unix seconds of
//! this attempt>`, `webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`)
//! and, for receivers written before them, `X-Signature: sha256=<hex HMAC-SHA256 of the body>`.
//! A secret in Standard Webhooks' `whsec_<base64>` form is keyed by its decoded bytes; any
//! other secret by its own bytes (`X-Signature` is keyed by the secret exactly as configured).
//! Unsigned requests are only sent when the operator said so (`NOTIFICACOES_WEBHOOK_UNSIGNED`).
//!
//! What the answer means: 2xx delivered; 5xx, 408, 429, a timeout or a connection failure may
//! pass, so the record is retried through the retry topics; any other answer (other 4xx, and
//! redirects, which are not followed) will not change by waiting, so it is dead-lettered.
//!
//! A failure's text never carries the URL (which may hold credentials and a token in its
//! query): it travels in the retry and dead-letter headers, the logs and `dlt list`. An
//! answer's body is read up to [`RESPONSE_BODY_LIMIT`], never more.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::StatusCode;
use sha2::Sha256;

/// The key notifications are signed with.
#[derive(Clone)]
pub struct WebhookSecret {
    /// As configured: the key of `X-Signature`.
    configured: String,
    /// The key of `webhook-signature`: a `whsec_` secret's decoded bytes, else `configured`'s.
    key: Vec<u8>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

/// A secret that cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the webhook secret is empty")]
    Empty,
    #[error("a whsec_ webhook secret must be base64 after its prefix: {0}")]
    NotBase64(String),
}

/// Standard Webhooks' prefix of a base64 secret.
const WHSEC_PREFIX: &str = "whsec_";

impl WebhookSecret {
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        // padding optional, as the reference libraries accept it
        let lenient = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let key = match text.strip_prefix(WHSEC_PREFIX) {
            Some(encoded) => {
                lenient.decode(encoded).map_err(|error| SecretError::NotBase64(error.to_string()))?
            }
            None => text.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self { configured: text.to_owned(), key })
    }
}

/// Where and how notifications are sent.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub url: reqwest::Url,
    /// Signs every request; unsigned when `None` (only when the operator said so).
    pub secret: Option<WebhookSecret>,
    /// The whole request, connection included, must finish within this.
    pub timeout: Duration,
    /// Idle connections kept per host.
    pub pool_idle_per_host: usize,
}

/// The webhook client could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    #[error("cannot build the webhook client")]
    Build(#[source] reqwest::Error),
}

// What each failed delivery is called in the `kafka_exception-fqcn` header (Spring writes an
// exception class there): a type per kind, so the name is `std::any::type_name` of a type that
// exists rather than a string kept in step by hand.

/// The receiver answered 5xx.
#[derive(Debug)]
pub struct ServerError;
/// The receiver answered 4xx.
#[derive(Debug)]
pub struct ClientError;
/// The receiver answered 1xx or 3xx.
#[derive(Debug)]
pub struct UnexpectedStatus;
/// No answer within the timeout.
#[derive(Debug)]
pub struct Timeout;
/// The receiver could not be reached.
#[derive(Debug)]
pub struct ConnectionFailed;
/// The request failed otherwise.
#[derive(Debug)]
pub struct RequestFailed;

/// How one delivery ended.
#[derive(Debug)]
pub enum Answer {
    /// 2xx.
    Delivered(StatusCode),
    /// May pass: 5xx, 408, 429, timeout, connection failure.
    Transient(DeliveryError),
    /// Will not pass by waiting: other 4xx, 3xx, 1xx.
    Permanent(DeliveryError),
}

/// Why a delivery failed; the type path of each variant is what a forwarded record's
/// `kafka_exception-fqcn` says.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("webhook answered {status}")]
    Status { status: StatusCode },
    #[error("webhook did not answer within {timeout:?}")]
    Timeout {
        timeout: Duration,
        #[source]
        source: reqwest::Error,
    },
    #[error("webhook unreachable")]
    Connection(#[source] reqwest::Error),
    #[error("webhook request failed")]
    Request(#[source] reqwest::Error),
}

impl DeliveryError {
    /// The exception class name for the retry and dead-letter headers.
    pub fn fqcn(&self) -> &'static str {
        use std::any::type_name;
        match self {
            Self::Status { status } if status.is_server_error() => type_name::<ServerError>(),
            Self::Status { status } if status.is_client_error() => type_name::<ClientError>(),
            Self::Status { .. } => type_name::<UnexpectedStatus>(),
            Self::Timeout { .. } => type_name::<Timeout>(),
            Self::Connection(_) => type_name::<ConnectionFailed>(),
            Self::Request(_) => type_name::<RequestFailed>(),
        }
    }

    /// The type path of the cause (`kafka_exception-cause-fqcn`, which Spring always writes):
    /// for a status answer there is no underlying error, so the status code's own type stands
    /// for it.
    pub fn cause_fqcn(&self) -> &'static str {
        match self {
            Self::Status { status } => std::any::type_name_of_val(status),
            Self::Timeout { source, .. } | Self::Connection(source) | Self::Request(source) => {
                std::any::type_name_of_val(source)
            }
        }
    }
}

/// Whether an HTTP status may change by retrying (`docs/reference/contract.md` §3).
pub fn is_transient(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC takes keys of any length
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// `webhook-signature` (Standard Webhooks): `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`.
pub fn standard_signature(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let digest = hmac_sha256(&secret.key, &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body]);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(digest))
}

/// `X-Signature`: `sha256=<lowercase hex HMAC-SHA256 of body keyed by secret>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let digest = hmac_sha256(secret.as_bytes(), &[body]);
    let mut text = String::with_capacity(7 + digest.len() * 2);
    text.push_str("sha256=");
    for byte in digest {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// One outgoing notification.
#[derive(Debug, Clone, Copy)]
pub struct Notification<'a> {
    pub event_id: uuid::Uuid,
    pub event_type: &'static str,
    /// The event JSON, sent as is.
    pub body: &'a [u8],
    /// Trace context of the delivery (`traceparent`, `tracestate`).
    pub trace: &'a [(String, String)],
}

/// A pooled HTTP client bound to one webhook.
#[derive(Debug, Clone)]
pub struct Webhook {
    client: reqwest::Client,
    settings: WebhookSettings,
}

impl Webhook {
    pub fn new(settings: WebhookSettings) -> Result<Self, ClientBuildError> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .pool_max_idle_per_host(settings.pool_idle_per_host)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("pagamentos-notificacoes/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| ClientBuildError::Build(error.without_url()))?;
        Ok(Self { client, settings })
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.settings.url
    }

    /// POSTs `notification` once and classifies the answer; records latency and outcome.
    pub async fn deliver(&self, notification: &Notification<'_>) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let insert = |headers: &mut HeaderMap, name: &str, value: &str| {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.insert(name, value);
            }
        };
        insert(&mut headers, "idempotency-key", &notification.event_id.to_string());
        insert(&mut headers, "x-evento-tipo", notification.event_type);
        if let Some(secret) = &self.settings.secret {
            let id = notification.event_id.to_string();
            let timestamp =
                SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs() as i64);
            insert(&mut headers, "webhook-id", &id);
            insert(&mut headers, "webhook-timestamp", &timestamp.to_string());
            let signed = standard_signature(secret, &id, timestamp, notification.body);
            insert(&mut headers, "webhook-signature", &signed);
            insert(&mut headers, "x-signature", &signature(&secret.configured, notification.body));
        }
        for (name, value) in notification.trace {
            insert(&mut headers, name, value);
        }
        let started = Instant::now();
        let result = self
            .client
            .post(self.settings.url.clone())
            .headers(headers)
            .body(notification.body.to_vec())
            .send()
            .await;
        // the URL out of every error: it may hold credentials and a token in its query, and
        // the error's text goes to the retry and dead-letter headers, the logs and `dlt list`
        let result = result.map_err(reqwest::Error::without_url);
        let answer = match result {
            Ok(response) => {
                let status = response.status();
                drain(response).await;
                if status.is_success() {
                    Answer::Delivered(status)
                } else if is_transient(status) {
                    Answer::Transient(DeliveryError::Status { status })
                } else {
                    Answer::Permanent(DeliveryError::Status { status })
                }
            }
            Err(error) if error.is_timeout() => {
                Answer::Transient(DeliveryError::Timeout { timeout: self.settings.timeout, source: error })
            }
            Err(error) if error.is_connect() => Answer::Transient(DeliveryError::Connection(error)),
            Err(error) => Answer::Transient(DeliveryError::Request(error)),
        };
        let outcome = match &answer {
            Answer::Delivered(_) => "delivered",
            Answer::Transient(_) => "transient_failure",
            Answer::Permanent(_) => "refused",
        };
        metrics::histogram!("notifications_webhook_seconds", "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("notifications_webhook_total", "outcome" => outcome).increment(1);
        answer
    }
}

/// Most bytes of an answer's body read: nothing in it is used.
pub const RESPONSE_BODY_LIMIT: usize = 64 * 1024;

/// Reads the answer's body so its connection can go back to the pool, unless it is larger than
/// [`RESPONSE_BODY_LIMIT`]: then what is left is not read, and the connection is closed with
/// the response. A receiver cannot make a delivery read (or wait for) an endless body.
async fn drain(mut response: reqwest::Response) {
    if response.content_length().is_some_and(|length| length > RESPONSE_BODY_LIMIT as u64) {
        return;
    }
    let mut read = 0;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len();
        if read > RESPONSE_BODY_LIMIT {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_in_lowercase_hex() {
        // RFC 4231, test case 2
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_ne!(
            signature("Jefe", b"what do ya want for nothing!"),
            signature("Jefe", b"what do ya want for nothing?")
        );
    }

    #[test]
    fn standard_webhooks_signature_matches_the_specifications_example() {
        // the example of the Standard Webhooks reference libraries' tests
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        assert_eq!(
            standard_signature(
                &secret,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_are_checked_and_never_shown() {
        assert_eq!(WebhookSecret::parse("").err(), Some(SecretError::Empty));
        assert_eq!(WebhookSecret::parse("whsec_").err(), Some(SecretError::Empty));
        assert!(matches!(WebhookSecret::parse("whsec_not base64!"), Err(SecretError::NotBase64(_))));
        let unpadded = WebhookSecret::parse("whsec_AQID").expect("unpadded");
        assert_eq!(unpadded.key, [1, 2, 3]);
        assert_eq!(WebhookSecret::parse("whsec_AQI").expect("unpadded").key, [1, 2]);
        let raw = WebhookSecret::parse("plain-secret").expect("raw secret");
        assert_eq!(raw.key, b"plain-secret");
        assert_eq!(format!("{raw:?}"), "WebhookSecret(***)");
    }

    #[test]
    fn transient_statuses_are_the_contracts() {
        for code in [500, 502, 503, 504, 408, 429] {
            assert!(is_transient(StatusCode::from_u16(code).expect("status")), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 410, 422, 301] {
            assert!(!is_transient(StatusCode::from_u16(code).expect("status")), "{code}");
        }
    }

    #[test]
    fn failures_name_their_kind() {
        let server = DeliveryError::Status { status: StatusCode::SERVICE_UNAVAILABLE };
        assert_eq!(server.fqcn(), "notifications::webhook::ServerError");
        assert_eq!(server.cause_fqcn(), "http::status::StatusCode");
        assert_eq!(server.to_string(), "webhook answered 503 Service Unavailable");
        let client = DeliveryError::Status { status: StatusCode::BAD_REQUEST };
        assert_eq!(client.fqcn(), "notifications::webhook::ClientError");
        assert_eq!(
            DeliveryError::Status { status: StatusCode::FOUND }.fqcn(),
            "notifications::webhook::UnexpectedStatus"
        );
    }

    #[tokio::test]
    async fn a_failed_request_names_the_error_it_holds_as_its_cause() {
        // nothing listens on port 9 (discard) of this host: the connection is refused
        let error = reqwest::Client::new().get("http://127.0.0.1:9/").send().await.expect_err("refused");
        let connection = DeliveryError::Connection(error);
        assert_eq!(connection.fqcn(), "notifications::webhook::ConnectionFailed");
        assert_eq!(connection.cause_fqcn(), "reqwest::error::Error");
        assert_eq!(connection.cause_fqcn(), std::any::type_name::<reqwest::Error>());
    }

    fn settings(url: &str, timeout: Duration) -> WebhookSettings {
        WebhookSettings { url: url.parse().expect("url"), secret: None, timeout, pool_idle_per_host: 1 }
    }

    const NOTIFICATION: Notification<'static> = Notification {
        event_id: uuid::Uuid::nil(),
        event_type: "TransferenciaLiquidada",
        body: b"{}",
        trace: &[],
    };

    /// What leaves the process of a failed delivery: the dead-letter and retry headers
    /// (`Failure`), and what the logs show (the chain, and the error's `Debug`).
    fn texts(error: &DeliveryError) -> Vec<String> {
        let failure = kafka::dead_letter::Failure::new(error.fqcn(), error.cause_fqcn(), error);
        vec![failure.message, failure.stacktrace, telemetry::error_chain(error), format!("{error:?}")]
    }

    #[tokio::test]
    async fn a_failure_never_carries_the_urls_credentials_or_token() {
        use tokio::io::AsyncWriteExt;
        // refused: a port bound, read and released
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address");
        // silent: accepts and never answers; closing: accepts and hangs up at once
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let closing = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (silent_address, closing_address) =
            (silent.local_addr().expect("address"), closing.local_addr().expect("address"));
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                held.push(stream);
            }
        });
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = closing.accept().await {
                let _ = stream.shutdown().await;
            }
        });
        for (address, kind) in [
            (closed, type_name_of::<ConnectionFailed>()),
            (silent_address, type_name_of::<Timeout>()),
            (closing_address, type_name_of::<RequestFailed>()),
        ] {
            let url = format!("http://user:s3cret@{address}/hook?token=t0ken");
            let webhook = Webhook::new(settings(&url, Duration::from_millis(500))).expect("client");
            let Answer::Transient(error) = webhook.deliver(&NOTIFICATION).await else {
                panic!("{url}: a transient failure")
            };
            assert_eq!(error.fqcn(), kind, "{error:?}");
            for text in texts(&error) {
                assert!(!text.contains("s3cret") && !text.contains("t0ken"), "{kind}: a secret in {text:?}");
            }
        }
    }

    fn type_name_of<T>() -> &'static str {
        std::any::type_name::<T>()
    }

    #[tokio::test]
    async fn a_huge_answer_is_not_read_past_the_limit() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let sent = std::sync::Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        // 200 and a chunked body that never ends, written as fast as it is read
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut request = vec![0; 64 * 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await;
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
            while counter.load(Ordering::Relaxed) < 1 << 30
                && stream.write_all(chunk.as_bytes()).await.is_ok()
            {
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        });
        let webhook = Webhook::new(settings(&format!("http://{address}/hook"), Duration::from_secs(10)))
            .expect("client");
        let started = Instant::now();
        let answer = webhook.deliver(&NOTIFICATION).await;
        assert!(matches!(answer, Answer::Delivered(StatusCode::OK)), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "read for {:?}", started.elapsed());
        // what the kernel's buffers hold besides what was read, and no more
        tokio::time::sleep(Duration::from_millis(300)).await;
        let written = sent.load(Ordering::Relaxed);
        assert!(written < 16 << 20, "{written} bytes of the answer taken");
    }
}
