//! A fault matrix under load (`cargo xtask bench chaos`, `tests/tests/lab_chaos.rs`).
//!
//! The lab is the demo's cluster shape ([`crate::cluster`]): three control-plane nodes (API VIP,
//! apiserver stand-ins and the echo service), two workers (ingress VIP, router stand-ins and
//! the echo service), a client and a hostile host, all on one bridge. The same cases run
//! against lbd ([`lbd::LbdFlavor`]) and, where they make sense, against keepalived + haproxy
//! in OpenShift's shape ([`keepalived::KeepalivedFlavor`]).
//!
//! While the cases run, the client holds [`LONG_LIVED`] long-lived connections (half through
//! each VIP) and opens [`SHORT_RATE`] new connections per second (alternating between the
//! VIPs), see [`load`]; a [`sampler`] records who holds each VIP every 20 ms. Each case starts
//! from a healthy cluster, injects its fault, and ends when the cluster is healthy again
//! (every daemon up and settled, one holder per VIP, every long-lived connection answering
//! after the fault ended, the last second of new connections all answered) or after
//! [`HEAL_TIMEOUT`], which fails it. Its numbers are cut from the load's record between the
//! two moments.

pub mod cases;
pub mod keepalived;
pub mod lbd;
pub mod load;
pub mod sampler;

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    cluster::{API_VIP, CONTROL_PLANE, ECHO_PORT, INGRESS_VIP, WORKERS},
    lab::{Lab, sh, try_sh},
};
pub use cases::Case;
use load::{Load, Proto, Target};
use sampler::Sampler;

pub const LONG_LIVED: usize = 200;
pub const SHORT_RATE: u32 = 200;
pub const HEAL_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest pause between answered new connections that still counts as "no gap" for a
/// planned event: at 100 connections per second per VIP the natural gap is 10 ms; the rest is
/// scheduling noise of a small shared machine.
pub const NO_GAP_MS: f64 = 300.0;
/// The longest gap allowed when a node (or its daemon, link or interface) fails.
pub const FAILOVER_GAP_MS: f64 = 1000.0;
/// Share of new connections allowed to fail when a node (or its daemon, ...) fails.
pub const FAILOVER_FAILED_SHARE: f64 = 0.01;

/// The nodes in sampler order: index i of a sample's holders is `NODES[i]`.
pub const NODES: [&str; 5] = ["cp1", "cp2", "cp3", "w1", "w2"];
/// The VIPs in sampler order.
pub const VIPS: [&str; 2] = [API_VIP, INGRESS_VIP];

/// What differs between lbd and keepalived + haproxy: how daemons start and stop, what
/// "settled" means, what a node runs.
pub trait Flavor {
    fn name(&self) -> &'static str;
    fn lab(&self) -> &Lab;
    fn lab_mut(&mut self) -> &mut Lab;
    /// VRRP advertisement interval, ms.
    fn advert_ms(&self) -> f64;
    /// Connection-table entries the flood case must overrun (10x).
    fn conntrack_size(&self) -> u32;
    /// Long-lived and short targets through the VIPs.
    fn targets(&self) -> (Vec<Target>, Vec<Target>);
    /// Signal the daemons that own the VIPs on `node` and wait for them to exit.
    fn stop_daemon(&mut self, node: &str, signal: i32);
    fn start_daemon(&mut self, node: &str);
    /// Whether the daemon process on `node` is (still) running; a daemon that exited on its
    /// own is noticed here.
    fn daemon_running(&mut self, node: &str) -> bool;
    /// Stop and start everything else a node runs (backends, proxies).
    fn stop_services(&mut self, node: &str);
    fn start_services(&mut self, node: &str);
    /// Clear what a reboot clears: addresses the daemon added, XDP, pinned state.
    fn reboot_cleanup(&mut self, node: &str);
    /// The daemons agree (one master per instance, backends up): Ok, or what is wrong.
    fn settled(&self) -> Result<(), String>;
    /// Whether the case applies to this flavor.
    fn supports(&self, case: Case) -> bool;
    /// How long the load balancers need to take a backend whose readiness failed out of new
    /// connections (health check interval x fall, and some): an upgrade's node waits that long
    /// after its apiserver turns not ready, as the apiserver's shutdown delay does.
    fn drain_ms(&self) -> u64 {
        // lbd's defaults: 3 x 200 ms + a 200 ms timeout, doubled.
        1600
    }
    /// Reload `node` with `config` written to its config file (lbd only).
    fn reload(&mut self, _node: &str, _config: &str) -> Result<(), String> {
        Err("reload is not supported".into())
    }
    /// The config `node` was started with (lbd only).
    fn base_config(&self, _node: &str) -> String {
        String::new()
    }
    /// The config of `node` with one VRRP instance changed (lbd only).
    fn changed_config(&self, _node: &str) -> String {
        String::new()
    }
}

/// The numbers of one case, as in `target/bench/chaos.json` plus details.
#[derive(Clone, Debug, Default)]
pub struct CaseResult {
    pub name: String,
    pub new_attempted: u64,
    pub new_failed: u64,
    pub long_lived_lost: u64,
    pub long_lived_lost_expected: u64,
    pub max_gap_ms: f64,
    pub dual_master_ms: f64,
    pub ok: bool,
    /// Why `ok` is false (each target missed), and other findings.
    pub notes: Vec<String>,
    pub owner_before: String,
    pub owner_after: String,
    pub daemon_restarts: u32,
    pub daemon_crashes: u32,
    pub healthy_again: bool,
    pub duration_ms: u64,
    pub skipped_slots: u64,
    pub lost_by_backend: BTreeMap<String, u64>,
    /// Long-lived connections on each node that went down, when it went.
    pub lost_expected_by_backend: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
}

impl CaseResult {
    /// The entry of `chaos.json`'s `cases` array (exactly the fields the issue names).
    pub fn json(&self) -> Value {
        json!({
            "name": self.name,
            "new_attempted": self.new_attempted,
            "new_failed": self.new_failed,
            "long_lived_lost": self.long_lived_lost,
            "long_lived_lost_expected": self.long_lived_lost_expected,
            "max_gap_ms": self.max_gap_ms,
            "dual_master_ms": self.dual_master_ms,
            "ok": self.ok,
        })
    }

    pub fn detail_json(&self) -> Value {
        let mut v = self.json();
        let o = v.as_object_mut().unwrap();
        o.insert("notes".into(), json!(self.notes));
        o.insert("owner_before".into(), json!(self.owner_before));
        o.insert("owner_after".into(), json!(self.owner_after));
        o.insert("daemon_restarts".into(), json!(self.daemon_restarts));
        o.insert("daemon_crashes".into(), json!(self.daemon_crashes));
        o.insert("healthy_again".into(), json!(self.healthy_again));
        o.insert("duration_ms".into(), json!(self.duration_ms));
        o.insert("skipped_slots".into(), json!(self.skipped_slots));
        o.insert("lost_by_backend".into(), json!(self.lost_by_backend));
        o.insert(
            "lost_expected_by_backend".into(),
            json!(self.lost_expected_by_backend),
        );
        o.insert("errors".into(), json!(self.errors));
        v
    }
}

/// A running chaos lab: the flavor's cluster, the client load and the VIP sampler.
pub struct Chaos {
    pub flavor: Box<dyn Flavor>,
    pub load: Load,
    pub sampler: Sampler,
    /// Daemon starts done by the cases (planned restarts) and after unexpected exits.
    restarts: u32,
    crashes: u32,
}

fn vip_addr(vip: &str, port: &str) -> SocketAddr {
    format!("{vip}:{port}").parse().unwrap()
}

/// Targets for a cluster whose both VIPs serve the echo service on [`ECHO_PORT`] and HTTP on 80.
pub fn standard_targets() -> (Vec<Target>, Vec<Target>) {
    let long = VIPS
        .iter()
        .map(|v| Target {
            addr: vip_addr(v, ECHO_PORT),
            proto: Proto::Echo,
        })
        .collect();
    let short = vec![
        Target {
            addr: vip_addr(API_VIP, ECHO_PORT),
            proto: Proto::Echo,
        },
        Target {
            addr: vip_addr(INGRESS_VIP, "80"),
            proto: Proto::Http,
        },
    ];
    (long, short)
}

impl Chaos {
    /// Start the load and the sampler on a freshly built cluster, once it has settled.
    pub fn start(flavor: Box<dyn Flavor>) -> Chaos {
        let client = flavor.lab().node("client").netns.clone();
        // Many short connections: a wide port range and TIME_WAIT reuse on the client.
        flavor
            .lab()
            .sysctl(&client, "net.ipv4.ip_local_port_range", "1024 65000");
        flavor.lab().sysctl(&client, "net.ipv4.tcp_tw_reuse", "1");
        let start = Instant::now();
        while let Err(e) = flavor.settled() {
            assert!(
                start.elapsed() < HEAL_TIMEOUT,
                "{}: the cluster never settled: {e}",
                flavor.name()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        let (long, short) = flavor.targets();
        let load = Load::start(&client, long, LONG_LIVED, short, SHORT_RATE);
        let netns: Vec<String> = NODES
            .iter()
            .map(|n| flavor.lab().node(n).netns.clone())
            .collect();
        let vips: Vec<Ipv4Addr> = VIPS.iter().map(|v| v.parse().unwrap()).collect();
        let clock = load.clock();
        let sampler = Sampler::start(&netns, &vips, clock);
        Chaos {
            flavor,
            load,
            sampler,
            restarts: 0,
            crashes: 0,
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.load.now_ms()
    }

    /// The node holding the API VIP now (exactly one), if any.
    pub fn owner(&self) -> Option<String> {
        self.holder(0)
    }

    /// The one node holding VIP `v` (index into [`VIPS`]) in the latest sample.
    pub fn holder(&self, v: usize) -> Option<String> {
        let s = self.sampler.last()?;
        (s.holders[v].len() == 1).then(|| NODES[s.holders[v][0]].to_string())
    }

    /// The node holding the API VIP, waiting up to 10 s for one to be unique.
    pub fn wait_owner(&self) -> Option<String> {
        crate::lab::wait_for(Duration::from_secs(10), || self.owner())
    }

    /// After a case that left the cluster broken: restart every daemon from a clean node (as
    /// an operator would), and wait until healthy. Err if even that does not help.
    pub fn repair(&mut self) -> Result<(), String> {
        for n in NODES {
            self.flavor.stop_daemon(n, libc::SIGKILL);
            self.flavor.reboot_cleanup(n);
            self.set_link(n, true);
        }
        for n in NODES {
            self.start_daemon(n);
        }
        let since = self.now_ms();
        self.wait_healthy(since, HEAL_TIMEOUT)
    }

    /// Start `node`'s daemon again; the log of its previous run is kept as `<tag>.<n>.log`.
    pub fn start_daemon(&mut self, node: &str) {
        self.restarts += 1;
        let dir = self.flavor.lab().dir.clone();
        for tag in [format!("lbd-{node}"), format!("ka-{node}")] {
            let log = dir.join(format!("{tag}.log"));
            if log.exists() {
                let _ = std::fs::rename(&log, dir.join(format!("{tag}.{}.log", self.restarts)));
            }
        }
        self.flavor.start_daemon(node);
    }

    /// Healthy: every daemon running (one that exited unexpectedly is restarted and counted),
    /// the daemons settled, one holder per VIP, every long-lived connection answered since
    /// `since`, and all new connections of the last second answered.
    pub fn healthy(&mut self, since: u64) -> Result<(), String> {
        for n in NODES {
            if !self.flavor.daemon_running(n) {
                self.crashes += 1;
                self.start_daemon(n);
                return Err(format!("the daemon on {n} had exited; restarted"));
            }
        }
        self.flavor.settled()?;
        for (v, name) in VIPS.iter().enumerate() {
            if self.holder(v).is_none() {
                let held: Vec<&str> = self
                    .sampler
                    .last()
                    .map(|s| s.holders[v].iter().map(|i| NODES[*i]).collect())
                    .unwrap_or_default();
                return Err(format!(
                    "not exactly one holder of {name}: held by [{}]",
                    held.join(", ")
                ));
            }
        }
        if !self.load.long_all_fresh(since) {
            return Err(format!(
                "long-lived connections: {} of {LONG_LIVED} up, not all answered since the fault",
                self.load.long_up()
            ));
        }
        let now = self.now_ms();
        let recent = self.load.shorts(now.saturating_sub(1000), now);
        let failed = recent.iter().filter(|s| s.result.is_err()).count();
        if recent.len() < (SHORT_RATE / 4) as usize || failed > 0 {
            return Err(format!(
                "new connections in the last second: {} answered, {failed} failed",
                recent.len() - failed
            ));
        }
        Ok(())
    }

    /// Wait until [`Chaos::healthy`]; the last reason on timeout.
    pub fn wait_healthy(&mut self, since: u64, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            match self.healthy(since) {
                Ok(()) => return Ok(()),
                Err(e) if start.elapsed() > timeout => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    pub fn restarts(&self) -> (u32, u32) {
        (self.restarts, self.crashes)
    }

    /// The switch namespace's name (the bridge lives there).
    pub fn switch(&self) -> String {
        format!("{}-sw", self.flavor.lab().prefix)
    }

    /// Replace `node`'s interface: delete the veth pair, wait `pause`, create it again with
    /// `mac` (None: the old MAC), the node's addresses, up, on the bridge.
    pub fn replace_link(&self, node: &str, pause: Duration, mac: Option<String>) {
        let lab = self.flavor.lab();
        let n = lab.node(node).clone();
        let sw = self.switch();
        let old_mac = current_mac(&n.netns).unwrap_or(n.mac.clone());
        sh(&["ip", "-n", &sw, "link", "del", node]);
        std::thread::sleep(pause);
        let mac = mac.unwrap_or(old_mac);
        sh(&[
            "ip", "-n", &sw, "link", "add", node, "type", "veth", "peer", "name", "eth0", "netns",
            &n.netns,
        ]);
        sh(&["ip", "-n", &sw, "link", "set", node, "master", "br0", "up"]);
        sh(&["ip", "-n", &n.netns, "link", "set", "eth0", "address", &mac]);
        sh(&[
            "ip",
            "-n",
            &n.netns,
            "addr",
            "add",
            &format!("{}/24", n.v4),
            "dev",
            "eth0",
        ]);
        sh(&[
            "ip",
            "-n",
            &n.netns,
            "addr",
            "add",
            &format!("{}/64", n.v6),
            "dev",
            "eth0",
            "nodad",
        ]);
        // The ARP sysctls of a DSR backend are per interface too: a new interface starts
        // from the defaults, as a rebuilt br-ex would; lbd sets them again.
        sh(&["ip", "-n", &n.netns, "link", "set", "eth0", "up"]);
    }

    pub fn set_link(&self, node: &str, up: bool) {
        let ns = self.flavor.lab().node(node).netns.clone();
        let _ = try_sh(&[
            "ip",
            "-n",
            &ns,
            "link",
            "set",
            "eth0",
            if up { "up" } else { "down" },
        ]);
    }
}

fn current_mac(netns: &str) -> Option<String> {
    let out = try_sh(&["ip", "-n", netns, "-j", "link", "show", "eth0"]);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0]["address"].as_str().map(str::to_string)
}

/// The shuffled order and the faults' details come from the project's seeded generator.
pub use crate::xdp_fuzz::Rng;

/// Fisher-Yates shuffle of `v` driven by `rng`.
pub fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i + 1);
        v.swap(i, j);
    }
}

/// Control-plane node names other than `node`.
pub fn other_cp(node: &str) -> Vec<&'static str> {
    CONTROL_PLANE
        .iter()
        .copied()
        .filter(|n| *n != node)
        .collect()
}

/// Whether `node` is a worker.
pub fn is_worker(node: &str) -> bool {
    WORKERS.contains(&node)
}

/// Run `cases` one after the other on a running lab; each case's details vary with `seed`.
pub fn run_cases(ch: &mut Chaos, cases: &[Case], seed: u64, label: &str) -> Vec<CaseResult> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        if !ch.flavor.supports(*c) {
            continue;
        }
        eprintln!(
            "[{}] {label} {}/{}: case {} {} ...",
            ch.flavor.name(),
            i + 1,
            cases.len(),
            c.number(),
            c.name()
        );
        let case_seed = rng.next_u64();
        let mut r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cases::run_case(ch, *c, case_seed)
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            CaseResult {
                name: c.name().to_string(),
                notes: vec![format!("MISSED: the harness failed: {msg}")],
                ..Default::default()
            }
        });
        eprintln!("{}", table_row(&r));
        for n in &r.notes {
            eprintln!("    {n}");
        }
        if !r.errors.is_empty() {
            eprintln!("    errors: {:?}", r.errors);
        }
        if !r.healthy_again {
            eprintln!("    repairing: every daemon restarted from a clean node");
            let repaired = ch.repair();
            r.notes.push(format!(
                "after the case the harness restarted every daemon: {}",
                match &repaired {
                    Ok(()) => "healthy again".to_string(),
                    Err(e) => format!("still not healthy: {e}"),
                }
            ));
            if let Err(e) = repaired {
                eprintln!("    the cluster stays broken ({e}); the remaining cases are not run");
                out.push(r);
                for c in cases[i + 1..].iter().filter(|c| ch.flavor.supports(**c)) {
                    out.push(CaseResult {
                        name: c.name().to_string(),
                        notes: vec!["MISSED: not run: the cluster stayed broken".into()],
                        ..Default::default()
                    });
                }
                break;
            }
        }
        out.push(r);
    }
    out
}

pub fn table_header() -> String {
    format!(
        "{:<34} {:>6} {:>6} {:>9} {:>8} {:>8} {:>11} {:>4} {:>3}",
        "case", "new", "failed", "lost/exp", "gap ms", "dual ms", "owner", "rst", "ok"
    )
}

pub fn table_row(r: &CaseResult) -> String {
    format!(
        "{:<34} {:>6} {:>6} {:>9} {:>8.0} {:>8.0} {:>11} {:>4} {:>3}",
        r.name,
        r.new_attempted,
        r.new_failed,
        format!("{}/{}", r.long_lived_lost, r.long_lived_lost_expected),
        r.max_gap_ms,
        r.dual_master_ms,
        format!("{}>{}", r.owner_before, r.owner_after),
        r.daemon_restarts,
        if r.ok { "yes" } else { "NO" }
    )
}
