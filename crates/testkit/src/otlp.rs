//! A small OTLP/HTTP receiver (JSON encoding) for trace tests: services export to it with
//! `OTEL_EXPORTER_OTLP_ENDPOINT=<url>` and `OTEL_EXPORTER_OTLP_PROTOCOL=http/json`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::Value;

/// One exported span.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub attributes: HashMap<String, String>,
}

/// The receiver; clones share the spans received.
#[derive(Debug, Clone, Default)]
pub struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    /// Serves on a free local port; returns the collector and its base URL.
    pub async fn start() -> (Self, String) {
        let collector = Self::default();
        let app = Router::new().route("/v1/traces", post(receive)).with_state(collector.clone());
        let address = crate::serve_locally(app).await;
        (collector, format!("http://{address}"))
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

fn text(value: &Value) -> String {
    value.as_str().map(str::to_owned).unwrap_or_default()
}

/// An attribute's value, whatever its type, as text.
fn attribute_value(value: &Value) -> String {
    value
        .as_object()
        .and_then(|object| object.values().next())
        .map(|inner| inner.as_str().map(str::to_owned).unwrap_or_else(|| inner.to_string()))
        .unwrap_or_default()
}

async fn receive(
    State(collector): State<Collector>,
    body: axum::body::Bytes,
) -> impl axum::response::IntoResponse {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => {
            eprintln!("OTLP collector: not JSON ({error}): {} bytes", body.len());
            return (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], "{}");
        }
    };
    let mut received = Vec::new();
    for resource in body["resourceSpans"].as_array().into_iter().flatten() {
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let attributes = span["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|attribute| (text(&attribute["key"]), attribute_value(&attribute["value"])))
                    .collect();
                received.push(Span {
                    trace_id: text(&span["traceId"]).to_lowercase(),
                    span_id: text(&span["spanId"]).to_lowercase(),
                    parent_span_id: text(&span["parentSpanId"]).to_lowercase(),
                    name: text(&span["name"]),
                    attributes,
                });
            }
        }
    }
    collector.spans.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend(received);
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], "{}")
}
