//! What each transfer is: its two accounts (uniform, Zipf-skewed, or one side always the hot
//! account) and its amount.

use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};

use contracts::Amount;

use crate::args::Skew;

/// Draws transfers over `accounts` accounts.
#[derive(Debug, Clone)]
pub struct Draw {
    accounts: u32,
    skew: Skew,
    zipf: Option<Zipf<f64>>,
    max_amount_cents: Amount,
}

/// The hot account of `hot-credit` and `hot-debit`.
const HOT: u32 = 0;

/// One transfer to send: account indexes and amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub source: u32,
    pub destination: u32,
    pub amount_cents: Amount,
}

impl Draw {
    /// `accounts ≥ 2` (the argument's range).
    pub fn new(accounts: u32, skew: Skew, max_amount_cents: Amount) -> Self {
        let zipf = match skew {
            // n ≥ 2 and s ≥ 0 finite are checked by the argument parsers
            Skew::Zipf(s) => Zipf::new(f64::from(accounts), s).ok(),
            Skew::Uniform | Skew::HotCredit | Skew::HotDebit => None,
        };
        Self { accounts, skew, zipf, max_amount_cents }
    }

    fn account(&self, rng: &mut StdRng) -> u32 {
        match &self.zipf {
            // ranks 1..=n, rank 1 the hottest
            Some(zipf) => (zipf.sample(rng) as u32).clamp(1, self.accounts) - 1,
            None => rng.random_range(0..self.accounts),
        }
    }

    /// Any account but the hot one.
    fn cold_account(&self, rng: &mut StdRng) -> u32 {
        rng.random_range(HOT + 1..self.accounts)
    }

    /// A transfer between two different accounts.
    pub fn next(&self, rng: &mut StdRng) -> Pick {
        let (source, destination) = match self.skew {
            Skew::HotCredit => (self.cold_account(rng), HOT),
            Skew::HotDebit => (HOT, self.cold_account(rng)),
            Skew::Uniform | Skew::Zipf(_) => {
                let source = self.account(rng);
                let mut destination = self.account(rng);
                while destination == source {
                    // under a steep Zipf the hottest account is drawn often: redraw uniformly
                    destination = rng.random_range(0..self.accounts);
                }
                (source, destination)
            }
        };
        let amount_cents = Amount::new(rng.random_range(1..=self.max_amount_cents.get()))
            .unwrap_or_else(|refused| unreachable!("drawn from 1 up: {refused}"));
        Pick { source, destination, amount_cents }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn counts(draw: &Draw, n: usize) -> Vec<u32> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0; 10];
        for _ in 0..n {
            let pick = draw.next(&mut rng);
            assert_ne!(pick.source, pick.destination);
            assert!((1..=500).contains(&pick.amount_cents.get()));
            counts[pick.source as usize] += 1;
        }
        counts
    }

    #[test]
    fn uniform_spreads_and_zipf_concentrates() {
        let uniform = counts(&Draw::new(10, Skew::Uniform, Amount::constant(500)), 20_000);
        assert!(uniform.iter().all(|&count| (1_600..2_400).contains(&count)), "{uniform:?}");
        let zipf = counts(&Draw::new(10, Skew::Zipf(1.5), Amount::constant(500)), 20_000);
        // rank 1 ~ 1/H(10,1.5) ≈ 0.48 of the draws; rank 10 ≈ 1.5 %
        assert!(zipf[0] > 8_000 && zipf[9] < 800, "{zipf:?}");
        assert!(zipf.windows(2).all(|pair| pair[0] >= pair[1]), "{zipf:?}");
    }

    /// How often each account is drawn as source and as destination.
    fn sides(draw: &Draw, accounts: usize, n: usize) -> (Vec<u32>, Vec<u32>) {
        let mut rng = StdRng::seed_from_u64(11);
        let (mut sources, mut destinations) = (vec![0; accounts], vec![0; accounts]);
        for _ in 0..n {
            let pick = draw.next(&mut rng);
            assert_ne!(pick.source, pick.destination);
            assert!((1..=500).contains(&pick.amount_cents.get()));
            sources[pick.source as usize] += 1;
            destinations[pick.destination as usize] += 1;
        }
        (sources, destinations)
    }

    #[test]
    fn hot_credit_credits_one_account_from_all_the_others() {
        let (sources, destinations) =
            sides(&Draw::new(10, Skew::HotCredit, Amount::constant(500)), 10, 18_000);
        assert_eq!(destinations[0], 18_000, "every transfer credits the hot account: {destinations:?}");
        assert_eq!(sources[0], 0, "the hot account never pays: {sources:?}");
        // the other nine spread evenly, 2 000 each
        assert!(sources[1..].iter().all(|&count| (1_600..2_400).contains(&count)), "{sources:?}");
    }

    #[test]
    fn hot_debit_debits_one_account_to_all_the_others() {
        let (sources, destinations) =
            sides(&Draw::new(10, Skew::HotDebit, Amount::constant(500)), 10, 18_000);
        assert_eq!(sources[0], 18_000, "every transfer debits the hot account: {sources:?}");
        assert_eq!(destinations[0], 0, "{destinations:?}");
        assert!(destinations[1..].iter().all(|&count| (1_600..2_400).contains(&count)), "{destinations:?}");
        // two accounts: always 0 → 1
        let (sources, destinations) = sides(&Draw::new(2, Skew::HotDebit, Amount::constant(500)), 2, 100);
        assert_eq!((sources, destinations), (vec![100, 0], vec![0, 100]));
    }

    #[test]
    fn two_accounts_always_differ() {
        let draw = Draw::new(2, Skew::Zipf(3.0), Amount::ONE_CENT);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1_000 {
            let pick = draw.next(&mut rng);
            assert_ne!(pick.source, pick.destination);
            assert_eq!(pick.amount_cents, Amount::ONE_CENT);
        }
    }
}
