//! The two deployments' processes: started, waited for, killed, signalled, their stacks dumped.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::common;
use crate::common::system::{free_port, System};

/// One process of a deployment.
pub struct Service {
    pub name: &'static str,
    pub subcommand: &'static str,
    /// Its own environment on top of the system's.
    pub env: Vec<(&'static str, String)>,
    /// Its HTTP ports, all answering `/readyz` once it is up.
    pub ports: Vec<u16>,
    pub child: Option<Child>,
}

impl Service {
    pub async fn start(&mut self, system: &System, logs: &Path) {
        let mut command = common::service(&system.topics, self.subcommand);
        system.env(&mut command);
        command.envs(self.env.iter().map(|(key, value)| (*key, value.as_str())));
        // warnings and errors of every run of the process, for a failure's post-mortem
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{}.log", self.subcommand)))
            .expect("log file");
        command.stderr(Stdio::from(log)).env("RUST_LOG", "warn,kafka=info");
        self.child = Some(command.spawn().unwrap_or_else(|error| panic!("start {}: {error}", self.name)));
        self.ready(Duration::from_secs(90)).await;
    }

    /// Waits until every one of its ports answers `/readyz` with success.
    pub async fn ready(&self, within: Duration) {
        // a probe that hangs (a service waiting on a cut-off broker) counts as not ready
        let probe = common::system::admin_client(Some(Duration::from_secs(5)));
        for port in &self.ports {
            let url = format!("http://127.0.0.1:{port}/readyz");
            testkit::eventually(&format!("{} ready ({url})", self.name), within, || async {
                let response = probe.get(&url).send().await.ok()?;
                response.status().is_success().then_some(())
            })
            .await;
        }
    }

    pub fn pid(&self) -> String {
        let child = self.child.as_ref().unwrap_or_else(|| panic!("{} is not running", self.name));
        child.id().unwrap_or_else(|| panic!("{} has exited", self.name)).to_string()
    }

    pub async fn kill(&mut self) {
        let mut child = self.child.take().unwrap_or_else(|| panic!("{} is not running", self.name));
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reap");
    }

    pub async fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid()]).status().await.expect("kill");
        assert!(status.success(), "kill {signal} {}", self.name);
    }
}

/// Deployment A (`pagamentos all` on the system's ports) and B (one process per service).
pub fn deployments(webhook: &str) -> (Service, Vec<Service>) {
    let webhook = ("NOTIFICACOES_WEBHOOK_URL", webhook.to_owned());
    let a = Service {
        name: "A: pagamentos all",
        subcommand: "all",
        env: vec![("PAGAMENTOS_INSTANCE_ID", testkit::unique("chaos-a")), webhook.clone()],
        ports: Vec::new(), // the system's, filled in by the caller
        child: None,
    };
    let instance = testkit::unique("chaos-b");
    let b = [
        ("B: transferencias", "transferencias", "TRANSFERENCIAS_LISTEN"),
        ("B: ledger", "ledger", "LEDGER_LISTEN"),
        ("B: antifraude", "antifraude", "ANTIFRAUDE_LISTEN"),
        ("B: notificacoes", "notificacoes", "NOTIFICACOES_LISTEN"),
    ]
    .into_iter()
    .map(|(name, subcommand, listen)| {
        let port = free_port();
        Service {
            name,
            subcommand,
            env: vec![
                (listen, format!("127.0.0.1:{port}")),
                ("PAGAMENTOS_INSTANCE_ID", instance.clone()),
                webhook.clone(),
            ],
            ports: vec![port],
            child: None,
        }
    })
    .collect();
    (a, b)
}

/// The threads' stacks of `process` into the log directory (when gdb is installed): where a
/// stuck loop waits.
pub async fn dump_stacks(process: &Service, logs: &Path) {
    let file = logs.join(format!("{}.stacks", process.subcommand));
    let output = Command::new("gdb")
        .args(["-batch", "-ex", "thread apply all bt", "-p", &process.pid()])
        .stdin(Stdio::null())
        .output()
        .await;
    if let Ok(output) = output {
        if std::fs::write(&file, &output.stdout).is_ok() {
            eprintln!("[chaos] stacks of {} in {}", process.name, file.display());
        }
    }
}
