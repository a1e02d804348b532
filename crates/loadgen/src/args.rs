//! `pagamentos loadgen`'s arguments (`docs/reference/contract.md` §1).

use std::fmt;
use std::str::FromStr;

use contracts::{Amount, Cents};
use kafka::KafkaArgs;

/// Drive transfers through the HTTP API and report throughput and latency. One probe transfer
/// (1 cent between the first two accounts) goes first and its outcome is awaited: the load
/// starts on a reader and a chain that are live; the probe is not counted.
#[derive(Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Transfers per second to offer on an open-loop schedule (a late send counts from when it
    /// was due); 0 = as fast as the system finishes them: --concurrency senders, each sending
    /// its next transfer once its last one is final.
    #[arg(long, default_value_t = 100)]
    pub rate: u32,

    /// Seconds to send for.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub duration: u64,

    /// Accounts to create and fund before sending (ids `LG<run>-<n>`).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(2..=1_000_000))]
    pub accounts: u32,

    /// How each transfer's accounts are drawn: `uniform`; `zipf:S` (S ≥ 0; the larger S, the
    /// more traffic lands on a few hot accounts); `hot-credit` (every transfer credits account 0,
    /// from an account drawn uniformly from the others) or `hot-debit` (every transfer debits
    /// account 0, which then opens with --opening-balance-cents × --accounts, as much as all
    /// accounts together, so that it does not run short and turn the load into rejections).
    #[arg(long, default_value = "uniform")]
    pub skew: Skew,

    /// Most requests in flight at once (the open loop's cap); with --rate 0, the number of
    /// transfers in flight end to end.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// Seconds to wait after the last send for every accepted transfer to reach a final status;
    /// whatever has not by then is reported as `lost`.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub drain_timeout: u64,

    /// Largest amount of one transfer, in cents (amounts are drawn uniformly from 1 to this;
    /// keep it below antifraud's block threshold for a load that settles).
    #[arg(long, default_value_t = Amount::constant(10_000), value_parser = Amount::parse)]
    pub max_amount_cents: Amount,

    /// Opening balance of every account, in cents.
    #[arg(long, default_value_t = Cents::new(100_000_000_000), value_parser = Cents::parse_balance)]
    pub opening_balance_cents: Cents,

    /// The transferencias API.
    #[arg(long, env = "LOADGEN_TRANSFERENCIAS_URL", default_value = "http://localhost:8080", value_parser = parse_base_url)]
    pub transferencias_url: String,

    /// The ledger's accounts API.
    #[arg(long, env = "LOADGEN_LEDGER_URL", default_value = "http://localhost:8081", value_parser = parse_base_url)]
    pub ledger_url: String,

    /// Bearer token for the transfers API (when the services have one).
    #[arg(long, env = "PAGAMENTOS_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,

    /// Bearer token for creating and funding accounts (when the ledger has one).
    #[arg(long, env = "PAGAMENTOS_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Seed of the random draws (accounts, amounts); random when absent.
    #[arg(long)]
    pub seed: Option<u64>,

    #[command(flatten)]
    pub kafka: KafkaArgs,
}

impl std::fmt::Debug for LoadgenArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that no URL password, token or secret is ever printed
        f.debug_struct("LoadgenArgs")
            .field("rate", &self.rate)
            .field("duration", &self.duration)
            .field("accounts", &self.accounts)
            .field("skew", &self.skew)
            .field("concurrency", &self.concurrency)
            .field("drain_timeout", &self.drain_timeout)
            .field("max_amount_cents", &self.max_amount_cents)
            .field("opening_balance_cents", &self.opening_balance_cents)
            .field("transferencias_url", &self.transferencias_url)
            .field("ledger_url", &self.ledger_url)
            .field("api_token", &self.api_token.as_ref().map(|_| "***"))
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("seed", &self.seed)
            .field("kafka", &self.kafka)
            .finish()
    }
}

/// How accounts are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Skew {
    Uniform,
    /// Zipf's law with exponent `s`: rank k is drawn with weight 1/k^s.
    Zipf(f64),
    /// Every transfer credits one account (the first); sources drawn uniformly from the rest.
    /// The ledger's hot row, with the events keyed (by source) over every partition.
    HotCredit,
    /// Every transfer debits one account (the first); destinations drawn uniformly from the
    /// rest. The hot row and, the events being keyed by source, one partition of every topic.
    HotDebit,
}

impl Skew {
    /// The account every transfer debits, if one does.
    pub fn hot_debit_account(self) -> Option<u32> {
        (self == Self::HotDebit).then_some(0)
    }
}

impl FromStr for Skew {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "uniform" => return Ok(Self::Uniform),
            "hot-credit" => return Ok(Self::HotCredit),
            "hot-debit" => return Ok(Self::HotDebit),
            _ => {}
        }
        let Some(exponent) = text.strip_prefix("zipf:") else {
            return Err(format!("{text:?} is not `uniform`, `zipf:S`, `hot-credit` or `hot-debit`"));
        };
        match exponent.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(Self::Zipf(s)),
            _ => Err(format!("zipf exponent {exponent:?} must be a number ≥ 0, e.g. zipf:1.1")),
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uniform => f.write_str("uniform"),
            Self::Zipf(s) => write!(f, "zipf:{s}"),
            Self::HotCredit => f.write_str("hot-credit"),
            Self::HotDebit => f.write_str("hot-debit"),
        }
    }
}

/// An `http(s)://host[:port]` base URL, kept without a trailing slash.
fn parse_base_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|error| format!("{text:?} is not a URL: {error}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{text:?} must be an http:// or https:// URL with a host"));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skews_parse_and_print() {
        assert_eq!("uniform".parse::<Skew>(), Ok(Skew::Uniform));
        assert_eq!("zipf:1.1".parse::<Skew>(), Ok(Skew::Zipf(1.1)));
        assert_eq!("zipf:0".parse::<Skew>(), Ok(Skew::Zipf(0.0)));
        assert_eq!("hot-credit".parse::<Skew>(), Ok(Skew::HotCredit));
        assert_eq!("hot-debit".parse::<Skew>(), Ok(Skew::HotDebit));
        for bad in
            ["zipf", "zipf:", "zipf:-1", "zipf:x", "zipf:NaN", "zipf:inf", "pareto:1", "", "hot", "hot-"]
        {
            assert!(bad.parse::<Skew>().is_err(), "{bad:?} accepted");
        }
        for skew in [Skew::Uniform, Skew::Zipf(1.5), Skew::HotCredit, Skew::HotDebit] {
            assert_eq!(skew.to_string().parse::<Skew>(), Ok(skew), "{skew} does not read back");
        }
        assert_eq!(Skew::Zipf(1.5).to_string(), "zipf:1.5");
        assert_eq!(Skew::HotDebit.hot_debit_account(), Some(0));
        assert_eq!(Skew::HotCredit.hot_debit_account(), None);
    }

    #[test]
    fn base_urls_are_http_with_a_host() {
        assert_eq!(parse_base_url("http://localhost:8080/").as_deref(), Ok("http://localhost:8080"));
        assert!(parse_base_url("https://api.example:443").is_ok());
        for bad in ["localhost:8080", "ftp://host", "http://", "not a url"] {
            assert!(parse_base_url(bad).is_err(), "{bad:?} accepted");
        }
    }
}
