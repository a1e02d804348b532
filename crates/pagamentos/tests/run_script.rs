//! `scripts/run` stops on one ctrl-c. The whole script cannot run inside the test suite: it
//! builds in release mode, migrates the shared stack's real databases and serves on the fixed
//! ports 8080–8083 that other runs may hold. So this test runs the script's own stop handler
//! and its final wait loop, cut from `scripts/run` between their markers, around a stand-in
//! for `pagamentos all` that drains and exits 0 on SIGTERM as the real one does, in a process
//! group of its own, and sends SIGINT to the whole group as a terminal's ctrl-c does.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The text of `scripts/run` from the line starting with `begin` to the one starting with
/// `end` (or the end of the file), markers excluded.
fn block(script: &str, begin: &str, end: Option<&str>) -> String {
    let mut lines = script.lines().skip_while(|line| !line.starts_with(begin));
    assert!(lines.next().is_some(), "scripts/run has no line {begin:?}");
    let body: Vec<&str> = lines.take_while(|line| end.is_none_or(|end| !line.starts_with(end))).collect();
    body.join("\n")
}

#[test]
fn one_ctrl_c_stops_scripts_run() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/run");
    let script = std::fs::read_to_string(path).expect("read scripts/run");
    let stop = block(&script, "# >>> stop handler", Some("# <<< stop handler"));
    let wait = block(&script, "# >>> wait for ctrl-c", None);
    let test_script = format!(
        "set -euo pipefail\n\
         # stands in for `pagamentos all &`: drains on SIGTERM and exits 0\n\
         bash -c 'trap \"exit 0\" TERM; while :; do sleep 0.2; done' &\n\
         SERVICES=$!\n\
         {stop}\n\
         echo ready\n\
         {wait}\n"
    );
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&test_script)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start bash");
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready", "the script did not reach its wait loop");
    // the loop's `sleep` may not have started yet: SIGINT lands either way (the trap runs
    // after the current command), and sent again it would hide a handler that needs two
    let status = Command::new("kill").args(["-INT", "--", &format!("-{pid}")]).status().expect("kill");
    assert!(status.success());

    // a failure detector, not synchronisation: the handler takes well under a second
    let started = Instant::now();
    let exited = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let Some(status) = exited else {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        let _ = child.wait();
        panic!("scripts/run's wait loop still running 60 s after one ctrl-c");
    };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("read the rest");
    assert!(status.success(), "exit {status}: {rest}");
    assert!(rest.contains("stopped (the stack keeps running"), "{rest}");
    // nothing of the group is left behind (the last `sleep`, killed, may take a moment to go)
    let started = Instant::now();
    loop {
        let left = Command::new("pgrep").args(["-g", &pid.to_string()]).output().expect("pgrep");
        if left.stdout.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "left: {}",
            String::from_utf8_lossy(&left.stdout)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
