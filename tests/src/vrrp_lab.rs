//! A cluster-shaped lab for VRRP: N nodes on one bridge, each running lbd (VRRP instance "api"
//! for one VIP) and a `labnode serve-id` backend, plus a client. Every node is a DSR backend of
//! the VIP (lbd holds it on lo); the VRRP master forwards with XDP.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    bin_dir,
    lab::{Lab, wait_for},
};

pub const VIP4: &str = "10.78.0.100";
pub const VIP6: &str = "fd78::100";
pub const PORT: &str = "8080";

/// How one node's lbd is configured.
#[derive(Clone, Debug)]
pub struct NodeOpts {
    pub priority: u8,
    pub preempt: bool,
    pub version: u8,
    pub advert_ms: u32,
    pub unicast: bool,
    pub ipv6: bool,
    pub auth_pass: Option<String>,
}

impl Default for NodeOpts {
    fn default() -> Self {
        NodeOpts {
            priority: 100,
            preempt: true,
            version: 3,
            advert_ms: 100,
            unicast: false,
            ipv6: false,
            auth_pass: None,
        }
    }
}

pub struct VrrpLab {
    pub lab: Lab,
    pub nodes: Vec<String>,
    pub opts: Vec<NodeOpts>,
    pub vip: &'static str,
    labnode: String,
}

impl VrrpLab {
    /// Nodes n1..nN with the given options, and a client. lbd is started on every node.
    pub fn new(labnode: &str, opts: Vec<NodeOpts>) -> VrrpLab {
        let ipv6 = opts.first().map(|o| o.ipv6).unwrap_or(false);
        let mut lab = Lab::new("vr");
        lab.add_node("client", "10.78.0.1", "fd78::1");
        let mut nodes = Vec::new();
        for i in 0..opts.len() {
            let n = format!("n{}", i + 1);
            lab.add_node(
                &n,
                &format!("10.78.0.{}", 11 + i),
                &format!("fd78::{}", 11 + i),
            );
            lab.spawn(&n, &format!("server-{n}"), labnode, &["serve-id", PORT, &n]);
            nodes.push(n);
        }
        let vip = if ipv6 { VIP6 } else { VIP4 };
        let l = VrrpLab {
            lab,
            nodes,
            opts,
            vip,
            labnode: labnode.to_string(),
        };
        for i in 0..l.nodes.len() {
            l.write_config(i);
        }
        let mut l = l;
        for i in 0..l.nodes.len() {
            l.start(i);
        }
        l
    }

    fn addr(&self, node: &str) -> String {
        let n = self.lab.node(node);
        if self.vip.contains(':') {
            n.v6.clone()
        } else {
            n.v4.clone()
        }
    }

    pub fn socket(&self, i: usize) -> String {
        self.lab
            .dir
            .join(format!("{}.sock", self.nodes[i]))
            .display()
            .to_string()
    }

    pub fn config_path(&self, i: usize) -> PathBuf {
        self.lab.dir.join(format!("{}.toml", self.nodes[i]))
    }

    fn pin_name(&self, i: usize) -> String {
        format!("{}_{}", self.lab.prefix.replace('-', "_"), self.nodes[i])
    }

    /// The config of node `i` from its options.
    pub fn config(&self, i: usize) -> String {
        let o = &self.opts[i];
        let mut c = format!(
            "interface = \"eth0\"\nname = \"{}\"\napi_socket = \"{}\"\nxdp_mode = \"skb\"\n",
            self.pin_name(i),
            self.socket(i)
        );
        c += &format!(
            "\n[[vips]]\nname = \"api\"\naddress = \"{}\"\nports = [{PORT}]\nvrrp = \"api\"\n[vips.health]\nkind = \"tcp\"\ninterval_ms = 200\n",
            self.vip
        );
        for n in &self.nodes {
            c += &format!("[[vips.backends]]\naddress = \"{}\"\n", self.addr(n));
        }
        c += &format!(
            "\n[[vrrp]]\nname = \"api\"\nvrid = 51\nversion = {}\npriority = {}\nadvert_interval_ms = {}\npreempt = {}\nvips = [\"{}\"]\n",
            o.version, o.priority, o.advert_ms, o.preempt, self.vip
        );
        if let Some(p) = &o.auth_pass {
            c += &format!("auth_pass = \"{p}\"\n");
        }
        if o.unicast {
            let me = &self.nodes[i];
            let peers: Vec<String> = self
                .nodes
                .iter()
                .filter(|n| *n != me)
                .map(|n| format!("\"{}\"", self.addr(n)))
                .collect();
            c += &format!(
                "unicast_src = \"{}\"\nunicast_peers = [{}]\n",
                self.addr(me),
                peers.join(", ")
            );
        }
        c
    }

    pub fn write_config(&self, i: usize) {
        std::fs::write(self.config_path(i), self.config(i)).unwrap();
    }

    /// Start lbd on node `i` (its log tag is `lbd-<node>`).
    pub fn start(&mut self, i: usize) {
        let n = self.nodes[i].clone();
        let cfg = self.config_path(i).display().to_string();
        self.lab
            .cleanup(PathBuf::from("/sys/fs/bpf").join(self.pin_name(i)));
        self.lab.spawn(
            &n,
            &format!("lbd-{n}"),
            bin_dir().join("lbd"),
            &["--config", &cfg],
        );
    }

    /// Stop lbd on node `i` with `signal` (SIGKILL: crash; SIGTERM: graceful).
    pub fn stop(&mut self, i: usize, signal: i32) {
        let n = self.nodes[i].clone();
        self.lab.stop(&format!("lbd-{n}"), signal);
    }

    pub fn lbctl(&self, i: usize, args: &[&str]) -> Option<Value> {
        let sock = self.socket(i);
        let mut a = vec!["--socket", sock.as_str(), "-o", "json"];
        a.extend_from_slice(args);
        let out = std::process::Command::new(bin_dir().join("lbctl"))
            .args(&a)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// VRRP state of node `i` ("master", "backup", ...), if its lbd answers.
    pub fn state(&self, i: usize) -> Option<String> {
        let v = self.lbctl(i, &["vrrp", "status"])?;
        v[0]["state"].as_str().map(|s| s.to_lowercase())
    }

    /// Indexes of nodes that say they are master.
    pub fn masters(&self, running: &[usize]) -> Vec<usize> {
        running
            .iter()
            .copied()
            .filter(|i| self.state(*i).as_deref() == Some("master"))
            .collect()
    }

    /// Wait until exactly one of `running` is master and the others backup, and it stays so for
    /// a few advert intervals (a preempting node may still be on its way); returns the master.
    pub fn wait_one_master(&self, running: &[usize], timeout: Duration) -> Option<usize> {
        let start = Instant::now();
        let first = self.one_master_now(running, timeout)?;
        std::thread::sleep(Duration::from_millis(800));
        let again = self.one_master_now(running, timeout.saturating_sub(start.elapsed()))?;
        (first == again)
            .then_some(again)
            .or_else(|| self.one_master_now(running, Duration::from_secs(2)))
    }

    fn one_master_now(&self, running: &[usize], timeout: Duration) -> Option<usize> {
        wait_for(timeout, || {
            let states: Vec<Option<String>> = running.iter().map(|i| self.state(*i)).collect();
            let masters: Vec<usize> = running
                .iter()
                .copied()
                .zip(&states)
                .filter(|(_, s)| s.as_deref() == Some("master"))
                .map(|(i, _)| i)
                .collect();
            let backups = states
                .iter()
                .filter(|s| s.as_deref() == Some("backup"))
                .count();
            (masters.len() == 1 && backups == running.len() - 1).then(|| masters[0])
        })
    }

    /// One short connection from the client to the VIP: the answering backend's id.
    pub fn probe(&self, timeout_ms: u64) -> Option<String> {
        let out = self
            .lab
            .cmd("client", &self.labnode)
            .args([
                "connect-many",
                self.vip,
                PORT,
                "1",
                "1",
                &timeout_ms.to_string(),
            ])
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["ok"] == 1)
            .then(|| v["by_id"].as_object()?.keys().next().cloned())
            .flatten()
    }

    /// Wait until the client gets answers through the VIP.
    pub fn wait_serving(&self, timeout: Duration) -> bool {
        wait_for(timeout, || self.probe(300).map(|_| ())).is_some()
    }

    /// Time from now until the client first gets an answer through the VIP, probing every 10 ms
    /// with short timeouts (a failover measurement: call right after stopping the master).
    pub fn time_to_answer(&self, limit: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.probe(100).is_some() {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}
