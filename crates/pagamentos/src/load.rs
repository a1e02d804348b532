//! `pagamentos loadgen`: the load generator (`docs/reference/contract.md` §1); progress on stderr, the
//! contract's JSON object as the last line on stdout, exit 1 when anything was lost or a
//! transfer had both a settlement and a rejection event.

use std::process::ExitCode;

use anyhow::Context;
use service::supervisor::Supervisor;

pub async fn run(args: loadgen::LoadgenArgs) -> anyhow::Result<ExitCode> {
    // ctrl-c ends the sending; what was accepted is still waited for and reported
    let signals = Supervisor::new();
    signals.cancel_on_signal();
    let stop = signals.shutdown_token();
    let report = loadgen::run(args, stop).await?;
    println!("{}", serde_json::to_string(&report).context("encode the report")?);
    Ok(if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
