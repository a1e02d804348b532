//! Field rules both APIs apply (`CONTRACT.md` §2).

/// Accounts reserved for the ledger's issuers (`EMISSOR-<MOEDA>`): never created through the
/// API, never a side of a transfer.
pub const ISSUER_PREFIX: &str = "EMISSOR-";
/// Longest account id (`VARCHAR(32)`).
pub const ACCOUNT_ID_LENGTH_MAX: usize = 32;

/// 1–32 characters of `[A-Za-z0-9_-]`, and not an issuer account.
pub fn validate_account_id(id: &str) -> Result<(), String> {
    validate_account_syntax(id)?;
    if id.starts_with(ISSUER_PREFIX) {
        return Err(format!("{ISSUER_PREFIX}… accounts are reserved for the ledger's issuers"));
    }
    Ok(())
}

/// 1–32 characters of `[A-Za-z0-9_-]`.
pub fn validate_account_syntax(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > ACCOUNT_ID_LENGTH_MAX {
        return Err(format!("must be 1 to {ACCOUNT_ID_LENGTH_MAX} characters"));
    }
    if !id.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-') {
        return Err("may contain only letters, digits, '_' and '-'".into());
    }
    Ok(())
}

/// An active ISO 4217 code, in capitals (`BRL`; not `brl`, `real` or `XYZ`).
pub fn is_active_currency(code: &str) -> bool {
    code.len() == 3
        && code.bytes().all(|byte| byte.is_ascii_uppercase())
        && iso_currency::Currency::from_code(code).is_some()
}

/// The issuer account of `currency`.
pub fn issuer_account(currency: &str) -> String {
    format!("{ISSUER_PREFIX}{currency}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_ids() {
        assert!(validate_account_id("CC-001_a").is_ok());
        assert!(validate_account_id("").is_err());
        assert!(validate_account_id(&"a".repeat(33)).is_err());
        assert!(validate_account_id("a b").is_err());
        assert!(validate_account_id("EMISSOR-BRL").is_err());
        assert!(validate_account_syntax("EMISSOR-BRL").is_ok());
    }

    #[test]
    fn currencies() {
        assert!(is_active_currency("BRL"));
        assert!(!is_active_currency("brl"));
        assert!(!is_active_currency("XYZ"));
        assert!(!is_active_currency("real"));
        assert_eq!(issuer_account("BRL"), "EMISSOR-BRL");
    }
}
