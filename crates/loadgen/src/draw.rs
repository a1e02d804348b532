//! What each transfer is: its two accounts (uniform or Zipf-skewed) and its amount.

use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};

use contracts::Cents;

use crate::args::Skew;

/// Draws transfers over `accounts` accounts.
#[derive(Debug, Clone)]
pub struct Draw {
    accounts: u32,
    zipf: Option<Zipf<f64>>,
    max_amount_cents: Cents,
}

/// One transfer to send: account indexes and amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub source: u32,
    pub destination: u32,
    pub amount_cents: Cents,
}

impl Draw {
    /// `accounts ≥ 2`, `max_amount_cents ≥ 1` (the arguments' ranges).
    pub fn new(accounts: u32, skew: Skew, max_amount_cents: Cents) -> Self {
        let zipf = match skew {
            Skew::Uniform => None,
            // n ≥ 2 and s ≥ 0 finite are checked by the argument parsers
            Skew::Zipf(s) => Zipf::new(f64::from(accounts), s).ok(),
        };
        Self { accounts, zipf, max_amount_cents: max_amount_cents.max(Cents::new(1)) }
    }

    fn account(&self, rng: &mut StdRng) -> u32 {
        match &self.zipf {
            // ranks 1..=n, rank 1 the hottest
            Some(zipf) => (zipf.sample(rng) as u32).clamp(1, self.accounts) - 1,
            None => rng.random_range(0..self.accounts),
        }
    }

    /// A transfer between two different accounts.
    pub fn next(&self, rng: &mut StdRng) -> Pick {
        let source = self.account(rng);
        let mut destination = self.account(rng);
        while destination == source {
            // under a steep Zipf the hottest account is drawn often: redraw uniformly
            destination = rng.random_range(0..self.accounts);
        }
        let amount_cents = Cents::new(rng.random_range(1..=self.max_amount_cents.get()));
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
        let uniform = counts(&Draw::new(10, Skew::Uniform, Cents::new(500)), 20_000);
        assert!(uniform.iter().all(|&count| (1_600..2_400).contains(&count)), "{uniform:?}");
        let zipf = counts(&Draw::new(10, Skew::Zipf(1.5), Cents::new(500)), 20_000);
        // rank 1 ~ 1/H(10,1.5) ≈ 0.48 of the draws; rank 10 ≈ 1.5 %
        assert!(zipf[0] > 8_000 && zipf[9] < 800, "{zipf:?}");
        assert!(zipf.windows(2).all(|pair| pair[0] >= pair[1]), "{zipf:?}");
    }

    #[test]
    fn two_accounts_always_differ() {
        let draw = Draw::new(2, Skew::Zipf(3.0), Cents::new(1));
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1_000 {
            let pick = draw.next(&mut rng);
            assert_ne!(pick.source, pick.destination);
            assert_eq!(pick.amount_cents, Cents::new(1));
        }
    }
}
