//! The risk score: 0–100, a pure function of the transfer (the same input always scores the
//! same, so a reprocessed record yields byte-identical output but for its timestamp).
//!
//! Rules, added up and capped at 100:
//! - amount band: under R$ 100 → 5; under R$ 1 000 → 10; under R$ 10 000 → 25; below the
//!   block threshold → 45; at or above it (`ANTIFRAUDE_BLOQUEIO_CENTAVOS`, default 10 000 000
//!   cents) → 90;
//! - a round amount (a whole multiple of R$ 1 000) → +20: round sums are typical of fraud.
//!
//! Below the threshold the score is at most 65, so only the threshold blocks (score ≥ 80 →
//! `BLOQUEADA_ANTIFRAUDE`); at or above it the score is at least 90.

use contracts::{Amount, TransferRequested};

/// Scores of 80 or more are blocked.
pub const BLOCK_SCORE: u8 = 80;
/// `ANTIFRAUDE_BLOQUEIO_CENTAVOS`'s default: R$ 100 000.
pub const DEFAULT_BLOCK_THRESHOLD_CENTS: Amount = Amount::constant(10_000_000);
const ROUND_AMOUNT_CENTS: i64 = 100_000;

/// The scoring rules with their one setting.
#[derive(Debug, Clone, Copy)]
pub struct Scorer {
    pub block_threshold_cents: Amount,
}

impl Default for Scorer {
    fn default() -> Self {
        Self { block_threshold_cents: DEFAULT_BLOCK_THRESHOLD_CENTS }
    }
}

impl Scorer {
    pub fn score(&self, transfer: &TransferRequested) -> u8 {
        let amount = transfer.amount_cents.get();
        let band: u8 = if amount >= self.block_threshold_cents.get() {
            90
        } else if amount < 10_000 {
            5
        } else if amount < 100_000 {
            10
        } else if amount < 1_000_000 {
            25
        } else {
            45
        };
        let round: u8 = if amount % ROUND_AMOUNT_CENTS == 0 { 20 } else { 0 };
        band.saturating_add(round).min(100)
    }

    pub fn blocks(&self, score: u8) -> bool {
        score >= BLOCK_SCORE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn transfer(amount_cents: i64) -> TransferRequested {
        TransferRequested {
            event_id: Uuid::nil(),
            transfer_id: Uuid::nil(),
            source_account: contracts::AccountId::parse("CC-001").expect("account"),
            destination_account: contracts::AccountId::parse("CC-002").expect("account"),
            amount_cents: Amount::new(amount_cents).expect("a positive amount"),
            currency: contracts::Currency::parse("BRL").expect("currency"),
            created_at: contracts::Timestamp::parse("2026-12-03T10:00:00Z").expect("timestamp"),
        }
    }

    #[test]
    fn documented_examples() {
        let scorer = Scorer::default();
        assert_eq!(scorer.score(&transfer(1_234)), 5);
        assert_eq!(scorer.score(&transfer(50_000)), 10);
        assert_eq!(scorer.score(&transfer(100_000)), 45); // R$ 1 000: band 25 + round 20
        assert_eq!(scorer.score(&transfer(9_999_999)), 45);
        assert_eq!(scorer.score(&transfer(9_900_000)), 65);
        assert_eq!(scorer.score(&transfer(10_000_000)), 100);
        assert_eq!(scorer.score(&transfer(10_000_001)), 90);
        assert!(!scorer.blocks(65));
        assert!(scorer.blocks(80));
    }

    #[test]
    fn the_threshold_is_configurable() {
        let scorer = Scorer { block_threshold_cents: Amount::constant(5_000) };
        assert!(scorer.blocks(scorer.score(&transfer(5_000))));
        assert!(!scorer.blocks(scorer.score(&transfer(4_999))));
    }

    proptest! {
        #[test]
        fn only_the_threshold_blocks_and_scores_stay_in_range(amount in 1i64..=i64::MAX) {
            let scorer = Scorer::default();
            let score = scorer.score(&transfer(amount));
            prop_assert!(score <= 100);
            prop_assert_eq!(scorer.blocks(score), amount >= DEFAULT_BLOCK_THRESHOLD_CENTS.get());
            prop_assert_eq!(score, scorer.score(&transfer(amount)));
        }
    }
}
