//! Network namespaces for a cluster's nodes, and cuts between them.

use std::sync::Mutex;

/// Whom a [`Fault::Partition`] cuts the node from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cut {
    /// From the other nodes only: its controller quorum traffic and its replication are cut,
    /// clients still reach it (and it answers them from what it last knew).
    Brokers,
    /// From the other nodes and from every client: a node off the network.
    Everyone,
}

/// `ip <args>`, which must succeed.
fn ip(args: &[&str]) {
    let output = std::process::Command::new("ip").args(args).output().expect("run ip");
    assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}

/// The network of a [`Cluster`] whose nodes run in network namespaces of their own: node n at
/// `10.202.n.2`, on a veth pair to a router namespace (the hub, `10.202.n.1` on its side), which
/// the host (the services, the test, the databases) reaches over one more veth pair
/// (`10.202.0.2` on the host, `10.202.0.1` in the hub; the host routes `10.202.0.0/16` there).
/// A partition is a set of `ip rule … blackhole` in the hub: the hub drops what the cut
/// forbids, silently (no reset, no ICMP error, no error on the sender, as a failed link in
/// the middle of the network), and nothing changes on the nodes themselves. Fixed names and
/// addresses: a run removes what an earlier one left behind. Dropping it removes everything
/// (the host's end of its veth pair and its route go with the hub).
pub struct Network {
    cuts: Mutex<Vec<Vec<String>>>,
}

impl Network {
    const HUB: &str = "pgm-k3-hub";
    const HOST_LINK: &str = "pgm-k3";

    pub fn node_namespace(n: usize) -> String {
        format!("pgm-k3-{n}")
    }

    pub fn address(n: usize) -> String {
        format!("10.202.{n}.2")
    }

    fn namespaces() -> Vec<String> {
        std::iter::once(Self::HUB.to_owned()).chain((1..=3).map(Self::node_namespace)).collect()
    }

    fn remove() {
        for namespace in Self::namespaces() {
            let _ = std::process::Command::new("ip").args(["netns", "del", &namespace]).output();
        }
        // the host's end goes with the hub, but not at once: deleting it deletes both ends now
        let _ = std::process::Command::new("ip").args(["link", "del", Self::HOST_LINK]).output();
    }

    pub fn create() -> Self {
        Self::remove();
        let hub = Self::HUB;
        ip(&["netns", "add", hub]);
        ip(&["netns", "exec", hub, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
        ip(&["-n", hub, "link", "set", "lo", "up"]);
        for n in 1..=3 {
            let namespace = Self::node_namespace(n);
            let hub_side = format!("n{n}");
            ip(&["netns", "add", &namespace]);
            ip(&[
                "link", "add", "eth0", "netns", &namespace, "type", "veth", "peer", "name", &hub_side,
                "netns", hub,
            ]);
            ip(&["-n", hub, "addr", "add", &format!("10.202.{n}.1/24"), "dev", &hub_side]);
            ip(&["-n", hub, "link", "set", &hub_side, "up"]);
            ip(&["-n", &namespace, "addr", "add", &format!("{}/24", Self::address(n)), "dev", "eth0"]);
            ip(&["-n", &namespace, "link", "set", "eth0", "up"]);
            ip(&["-n", &namespace, "link", "set", "lo", "up"]);
            ip(&["-n", &namespace, "route", "add", "default", "via", &format!("10.202.{n}.1")]);
        }
        ip(&["link", "add", Self::HOST_LINK, "type", "veth", "peer", "name", "host", "netns", hub]);
        ip(&["-n", hub, "addr", "add", "10.202.0.1/24", "dev", "host"]);
        ip(&["-n", hub, "link", "set", "host", "up"]);
        ip(&["addr", "add", "10.202.0.2/24", "dev", Self::HOST_LINK]);
        ip(&["link", "set", Self::HOST_LINK, "up"]);
        ip(&["route", "add", "10.202.0.0/16", "via", "10.202.0.1", "dev", Self::HOST_LINK]);
        Self { cuts: Mutex::new(Vec::new()) }
    }

    /// The hub's rules (`ip rule` selectors) that cut node `n` off as `cut` says.
    fn rules(n: usize, cut: Cut) -> Vec<Vec<String>> {
        let node = Self::address(n);
        match cut {
            Cut::Brokers => (1..=3)
                .filter(|other| *other != n)
                .flat_map(|other| {
                    let other = Self::address(other);
                    [
                        vec!["from".to_owned(), node.clone(), "to".to_owned(), other.clone()],
                        vec!["from".to_owned(), other, "to".to_owned(), node.clone()],
                    ]
                })
                .collect(),
            Cut::Everyone => {
                vec![vec!["from".to_owned(), node.clone()], vec!["to".to_owned(), node]]
            }
        }
    }

    fn rule(action: &str, selector: &[String]) {
        let mut args = vec!["-n", Self::HUB, "rule", action];
        args.extend(selector.iter().map(String::as_str));
        args.push("blackhole");
        ip(&args);
    }

    /// Cuts node `n` off until the returned guard is dropped.
    pub fn cut(&self, n: usize, cut: Cut) -> Partition<'_> {
        let rules = Self::rules(n, cut);
        for rule in &rules {
            Self::rule("add", rule);
        }
        self.cuts.lock().expect("lock").extend(rules.iter().cloned());
        Partition { network: self, rules }
    }

    fn heal(&self, rules: &[Vec<String>]) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for rule in rules {
            if let Some(at) = cuts.iter().position(|cut| cut == rule) {
                cuts.remove(at);
                let mut args = vec!["-n", Self::HUB, "rule", "del"];
                args.extend(rule.iter().map(String::as_str));
                args.push("blackhole");
                let _ = std::process::Command::new("ip").args(&args).output();
            }
        }
    }

    pub fn heal_all(&self) {
        let rules = self.cuts.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        self.heal(&rules);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        Self::remove();
    }
}

/// A cut in force; dropping it heals it (on a test's failure too).
pub struct Partition<'a> {
    network: &'a Network,
    rules: Vec<Vec<String>>,
}

impl Drop for Partition<'_> {
    fn drop(&mut self) {
        self.network.heal(&self.rules);
    }
}
