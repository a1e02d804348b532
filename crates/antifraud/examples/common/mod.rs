//! What antifraude's benchmarks share: the requests they offer.

use serde_json::json;
use uuid::Uuid;

/// The `n`th transfer request: key (its source account, one of 1 000) and JSON body.
pub fn request(n: usize) -> (String, String) {
    let key = format!("CC-{:03}", n % 1000);
    let event = json!({
        "eventoId": Uuid::new_v4(), "transferenciaId": Uuid::new_v4(), "contaOrigem": key,
        "contaDestino": "CC-999", "valorEmCentavos": 100 + n, "moeda": "BRL",
        "criadaEm": "2026-12-03T10:00:00Z"
    });
    (key, event.to_string())
}
