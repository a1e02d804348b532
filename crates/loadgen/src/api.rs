//! The two HTTP APIs as loadgen uses them: accounts on the ledger, transfers on transferencias.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::{Client, RequestBuilder, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use contracts::{Amount, Cents};
use telemetry::error_chain;

use crate::LoadgenError;

/// How long one request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The APIs and their tokens.
#[derive(Debug, Clone)]
pub struct Api {
    http: Client,
    transfers: String,
    ledger: String,
    api_token: Option<String>,
    admin_token: Option<String>,
}

/// What answered a transfer request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    Accepted(Uuid),
    /// Not accepted: the status (and problem title) or the transport error, for the summary.
    Refused(String),
}

impl Api {
    pub fn new(
        transfers: &str,
        ledger: &str,
        api_token: Option<String>,
        admin_token: Option<String>,
        connections: usize,
    ) -> Result<Self, LoadgenError> {
        let http = Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(connections)
            .tcp_nodelay(true)
            .build()
            .map_err(|error| LoadgenError::Http {
                what: "build the HTTP client".into(),
                detail: error.to_string(),
            })?;
        Ok(Self { http, transfers: transfers.to_owned(), ledger: ledger.to_owned(), api_token, admin_token })
    }

    fn with(request: RequestBuilder, token: Option<&String>) -> RequestBuilder {
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Both APIs answer `/readyz` with 200.
    pub async fn ready(&self) -> Result<(), LoadgenError> {
        for base in [&self.transfers, &self.ledger] {
            let url = format!("{base}/readyz");
            let response = self.http.get(&url).send().await.map_err(|error| LoadgenError::Http {
                what: format!("reach {url}"),
                detail: error_chain(&error),
            })?;
            if !response.status().is_success() {
                let body = response.text().await.unwrap_or_default();
                return Err(LoadgenError::Http {
                    what: format!("{url} is not ready"),
                    detail: body.trim().to_owned(),
                });
            }
        }
        Ok(())
    }

    /// `POST /contas` with an opening balance; an account that exists already is an error
    /// (account ids carry the run id, so it would be another run's).
    pub async fn open_account(&self, id: &str, opening_cents: Cents) -> Result<(), LoadgenError> {
        let request = self
            .http
            .post(format!("{}/contas", self.ledger))
            .json(&json!({"id": id, "moeda": "BRL", "saldoInicialCentavos": opening_cents}));
        let response = Self::with(request, self.admin_token.as_ref()).send().await.map_err(|error| {
            LoadgenError::Http { what: format!("create account {id}"), detail: error_chain(&error) }
        })?;
        if response.status() == StatusCode::CREATED {
            return Ok(());
        }
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        Err(LoadgenError::Http { what: format!("create account {id}"), detail: format!("{status}: {body}") })
    }

    /// `POST /transferencias` with a fresh `Idempotency-Key`, as a payments client sends it.
    pub async fn transfer(&self, source: &str, destination: &str, amount_cents: Amount) -> Sent {
        let request = self
            .http
            .post(format!("{}/transferencias", self.transfers))
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&json!({
                "contaOrigem": source,
                "contaDestino": destination,
                "valorEmCentavos": amount_cents,
                "moeda": "BRL",
            }));
        let response = match Self::with(request, self.api_token.as_ref()).send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => return Sent::Refused("timeout".into()),
            Err(error) if error.is_connect() => return Sent::Refused("connection refused".into()),
            Err(error) => return Sent::Refused(format!("transport: {error}")),
        };
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status != StatusCode::ACCEPTED {
            let title = body["title"].as_str().unwrap_or("");
            return Sent::Refused(format!("{} {title}", status.as_u16()).trim_end().to_owned());
        }
        match body["id"].as_str().and_then(|id| Uuid::parse_str(id).ok()) {
            Some(id) => Sent::Accepted(id),
            None => Sent::Refused("202 without an id".into()),
        }
    }

    /// Ids of the transfers of `account` the API still shows `PENDENTE` (up to 500).
    pub async fn pending(&self, account: &str) -> Result<HashSet<Uuid>, LoadgenError> {
        let request = self.http.get(format!("{}/transferencias", self.transfers)).query(&[
            ("conta", account),
            ("status", "PENDENTE"),
            ("limit", "500"),
        ]);
        let what = || format!("list pending transfers of {account}");
        let response = Self::with(request, self.api_token.as_ref())
            .send()
            .await
            .map_err(|error| LoadgenError::Http { what: what(), detail: error_chain(&error) })?;
        if !response.status().is_success() {
            return Err(LoadgenError::Http { what: what(), detail: response.status().to_string() });
        }
        let body: Vec<Value> = response
            .json()
            .await
            .map_err(|error| LoadgenError::Http { what: what(), detail: error.to_string() })?;
        Ok(body
            .iter()
            .filter_map(|transfer| transfer["id"].as_str())
            .filter_map(|id| Uuid::parse_str(id).ok())
            .collect())
    }
}
