//! Deterministic ids: Java's `UUID.nameUUIDFromBytes` and the derived event ids built on it.
//!
//! A reprocessed input must yield the same event id, so downstream consumers can see the
//! duplicate (`docs/reference/contract.md` §3, *Derived event ids*). Java's function is MD5 over the bytes
//! alone, with no namespace, then the version (3) and IETF variant bits set; `uuid`'s `new_v3`
//! prepends a namespace, so it is not the same function.

use md5::{Digest, Md5};
use uuid::Uuid;

/// `"analisada:"`: the `TransferenciaAnalisada` written by antifraud.
pub const ANALYSED_PREFIX: &str = "analisada:";
/// `"rejeitada-antifraude:"`: the `TransferenciaRejeitada(BLOQUEADA_ANTIFRAUDE)` of antifraud.
pub const REJECTED_BY_ANTIFRAUD_PREFIX: &str = "rejeitada-antifraude:";
/// `"liquidada:"`: the `TransferenciaLiquidada` written by the ledger.
pub const SETTLED_PREFIX: &str = "liquidada:";
/// `"rejeitada-ledger:"`: a `TransferenciaRejeitada` written by the ledger.
pub const REJECTED_BY_LEDGER_PREFIX: &str = "rejeitada-ledger:";
/// `"abertura:"`: an account's opening balance is the deposit `name_uuid_from_bytes("abertura:" + id)`.
pub const OPENING_DEPOSIT_PREFIX: &str = "abertura:";

/// Java's `UUID.nameUUIDFromBytes(bytes)`.
pub fn name_uuid_from_bytes(bytes: &[u8]) -> Uuid {
    let digest: [u8; 16] = Md5::digest(bytes).into();
    uuid::Builder::from_md5_bytes(digest).into_uuid()
}

/// `nameUUIDFromBytes(prefix + transferId)` with the transfer id in its canonical lowercase,
/// hyphenated form (what Java's `UUID.toString()` prints).
pub fn derived_event_id(prefix: &str, transfer_id: Uuid) -> Uuid {
    let mut name = String::with_capacity(prefix.len() + 36);
    name.push_str(prefix);
    name.push_str(&transfer_id.hyphenated().to_string());
    name_uuid_from_bytes(name.as_bytes())
}

/// The id of the opening-balance deposit of account `account_id`.
pub fn opening_deposit_id(account_id: &str) -> Uuid {
    name_uuid_from_bytes(format!("{OPENING_DEPOSIT_PREFIX}{account_id}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRANSFER: &str = "3f2c9a4e-1b7d-4c8e-9f00-5a6b7c8d9e01";

    #[test]
    fn matches_java_name_uuid_from_bytes() {
        // vectors from issue #3, computed with Java's UUID.nameUUIDFromBytes
        let cases = [
            ("analisada:3f2c9a4e-1b7d-4c8e-9f00-5a6b7c8d9e01", "af0574b2-4179-3a0d-9a1e-5734d5dd853d"),
            (
                "rejeitada-antifraude:3f2c9a4e-1b7d-4c8e-9f00-5a6b7c8d9e01",
                "7d6103bd-7956-38b4-9e4b-7586a7c1e07a",
            ),
            ("", "d41d8cd9-8f00-3204-a980-0998ecf8427e"),
        ];
        for (name, expected) in cases {
            assert_eq!(name_uuid_from_bytes(name.as_bytes()).to_string(), expected, "name {name:?}");
        }
    }

    #[test]
    fn derived_ids_use_the_prefix_and_the_canonical_transfer_id() {
        let transfer = Uuid::parse_str(TRANSFER).expect("uuid");
        assert_eq!(
            derived_event_id(ANALYSED_PREFIX, transfer).to_string(),
            "af0574b2-4179-3a0d-9a1e-5734d5dd853d"
        );
        assert_eq!(
            derived_event_id(REJECTED_BY_ANTIFRAUD_PREFIX, transfer).to_string(),
            "7d6103bd-7956-38b4-9e4b-7586a7c1e07a"
        );
        // an uppercase input id is the same transfer and must give the same event id
        let upper = Uuid::parse_str(&TRANSFER.to_uppercase()).expect("uuid");
        assert_eq!(derived_event_id(SETTLED_PREFIX, upper), derived_event_id(SETTLED_PREFIX, transfer));
        assert_ne!(
            derived_event_id(SETTLED_PREFIX, transfer),
            derived_event_id(REJECTED_BY_LEDGER_PREFIX, transfer)
        );
    }

    #[test]
    fn version_and_variant_bits_are_javas() {
        let id = name_uuid_from_bytes(b"abertura:CC-001");
        assert_eq!(id.get_version_num(), 3);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(opening_deposit_id("CC-001"), id);
    }
}
