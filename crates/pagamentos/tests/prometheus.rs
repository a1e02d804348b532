//! The monitoring files under `deploy/grafana/` checked by a real Prometheus (Debian's
//! `prometheus` package, which brings `promtool`; `scripts/test` installs it): the alert rules
//! and the scrape configuration pass `promtool check`, the alert unit tests in `alerts_test.yml`
//! pass `promtool test rules` and cover every alert firing and staying silent.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The checkout, found at run time (a test binary may be shared by several clones).
fn checkout() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
    PathBuf::from(package).join("../..")
}

fn grafana(file: &str) -> PathBuf {
    checkout().join("deploy/grafana").join(file)
}

/// `name` on `PATH`, or a panic telling how to get it: these tests do not skip.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file()).unwrap_or_else(
        || {
            panic!(
                "{name} not found on PATH: install Debian's `prometheus` package \
                 (apt-get install prometheus; scripts/test installs it), which brings \
                 prometheus and promtool"
            )
        },
    )
}

/// Runs `promtool args…`; panics with its output unless it succeeds.
fn promtool(args: &[&Path]) -> String {
    let output = Command::new(tool("promtool")).args(args).output().expect("run promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?} failed ({}):\n{text}", output.status);
    text
}

/// The alert names `alerts.yml` defines (`- alert: Name` lines).
fn alert_names() -> Vec<String> {
    let rules = std::fs::read_to_string(grafana("alerts.yml")).expect("read alerts.yml");
    rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect()
}

#[test]
fn the_alert_rules_and_the_scrape_config_pass_promtool() {
    let names = alert_names();
    let checked = promtool(&[Path::new("check"), Path::new("rules"), &grafana("alerts.yml")]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", names.len())), "{checked}");
    promtool(&[Path::new("check"), Path::new("config"), &grafana("prometheus.yml")]);
    let tested = promtool(&[Path::new("test"), Path::new("rules"), &grafana("alerts_test.yml")]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every alert of `alerts.yml` has a unit test where it fires and one where it stays silent
/// (`exp_alerts: []`), so a new alert without tests, or a test that only ever expects silence,
/// fails here.
#[test]
fn every_alert_has_unit_tests_firing_and_silent() {
    let names = alert_names();
    assert!(names.contains(&"DeadLettersWaiting".to_owned()), "{names:?}");
    let tests = std::fs::read_to_string(grafana("alerts_test.yml")).expect("read alerts_test.yml");
    // (alert name, expects silence) for each `alertname:` followed by its `exp_alerts:`
    let mut cases = Vec::new();
    let mut lines = tests.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#'));
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("alertname:") {
            let expected = lines.next().unwrap_or_default();
            let silent = match expected.strip_prefix("exp_alerts:").map(str::trim) {
                Some("[]") => true,
                Some("") => false,
                _ => panic!("alertname {name} is not followed by exp_alerts: {expected:?}"),
            };
            cases.push((name.trim().to_owned(), silent));
        }
    }
    for name in &names {
        for (silent, what) in [(false, "fires"), (true, "stays silent")] {
            assert!(
                cases.contains(&(name.clone(), silent)),
                "deploy/grafana/alerts_test.yml has no case where {name} {what}; cases: {cases:?}"
            );
        }
    }
    let unknown: Vec<&(String, bool)> = cases.iter().filter(|(name, _)| !names.contains(name)).collect();
    assert!(unknown.is_empty(), "unit tests of alerts that alerts.yml does not define: {unknown:?}");
}
