//! The BGP ECMP lab: a router running FRR (eBGP, multipath, L4 ECMP hashing, BFD) with a client
//! network behind it, three LB nodes each running FRR and lbd (`announce = "bgp"`), and three
//! DSR backends (VIP on lo, arp_ignore) whose replies go back through the router.
//!
//! ```text
//!  client (10.82.0.2) -- router (10.81.0.1 / 10.82.0.1, AS 65000)
//!                            |  fabric bridge
//!      lb1 lb2 lb3 (10.81.0.11-13, AS 65001)   b1 b2 b3 (10.81.0.21-23)
//! ```
//! Shared by the tests (tests/lab_bgp.rs) and `cargo xtask bench scale`.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    bin_dir,
    lab::{Lab, Node, sh, wait_for},
};

pub const VIP4: &str = "10.83.0.10";
pub const VIP6: &str = "fd83::10";
pub const PORT: &str = "8080";
pub const LB_NODES: [&str; 3] = ["lb1", "lb2", "lb3"];
pub const BACKENDS: [(&str, u32); 3] = [("b1", 1), ("b2", 1), ("b3", 2)];
pub const ROUTER_ASN: u32 = 65000;
pub const LB_ASN: u32 = 65001;
/// BFD timers of every session: 100 ms x 3 = 300 ms detection.
pub const BFD_MS: u32 = 100;
pub const BFD_MULT: u32 = 3;

const FRR_DAEMONS: [&str; 3] = ["zebra", "bgpd", "bfdd"];

pub struct BgpLab {
    pub lab: Lab,
    /// The LB nodes sync connections (`[sync]`, one cluster key).
    sync: bool,
    /// `failed_backend_hold_ms`, if not the default.
    hold_ms: Option<u64>,
}

fn lb_addr(i: usize) -> (String, String) {
    (format!("10.81.0.{}", 11 + i), format!("fd81::{}", 11 + i))
}

impl BgpLab {
    /// Build the lab and wait until every LB node announces both VIPs and the router has three
    /// ECMP next hops for each.
    pub fn new() -> BgpLab {
        BgpLab::build(false, None)
    }

    /// As [`BgpLab::new`], the LB nodes syncing connections or not, with a failed backend's
    /// flows held `hold_ms`.
    pub fn with_sync(sync: bool, hold_ms: u64) -> BgpLab {
        BgpLab::build(sync, Some(hold_ms))
    }

    fn build(sync: bool, hold_ms: Option<u64>) -> BgpLab {
        let mut lab = Lab::new("bgp");
        let router = lab.add_node("router", "10.81.0.1", "fd81::1");
        for (k, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            // ECMP by the 5-tuple, so connections of one client spread over the LB nodes.
            ("net.ipv4.fib_multipath_hash_policy", "1"),
            ("net.ipv6.fib_multipath_hash_policy", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            lab.sysctl(&router.netns, k, v);
        }
        add_client(&mut lab, &router);
        for (i, n) in LB_NODES.iter().enumerate() {
            let (v4, v6) = lb_addr(i);
            lab.add_node(n, &v4, &v6);
        }
        let labnode = bin_dir().join("labnode");
        for (i, (n, _)) in BACKENDS.iter().enumerate() {
            let b = lab.add_node(
                n,
                &format!("10.81.0.{}", 21 + i),
                &format!("fd81::{}", 21 + i),
            );
            lab.make_dsr_backend(n, &[VIP4, VIP6]);
            sh(&[
                "ip",
                "-n",
                &b.netns,
                "route",
                "add",
                "default",
                "via",
                "10.81.0.1",
            ]);
            sh(&[
                "ip", "-n", &b.netns, "-6", "route", "add", "default", "via", "fd81::1",
            ]);
            let l = labnode.to_str().unwrap().to_string();
            lab.spawn(n, &format!("server-{n}"), &l, &["serve-id", PORT, n]);
        }
        let mut l = BgpLab { lab, sync, hold_ms };
        l.start_frr("router", &router_config());
        for n in LB_NODES {
            // The LB nodes' FRR starts empty: lbd configures it.
            l.start_frr(n, &format!("hostname {n}\n"));
        }
        for (i, n) in LB_NODES.iter().enumerate() {
            let cfg = l.lbd_config(i, n);
            std::fs::write(l.config_path(n), cfg).unwrap();
            l.start_lbd(n);
        }
        let ok = wait_for(Duration::from_secs(40), || {
            (l.router_nexthops(VIP4).len() == 3
                && l.router_nexthops(VIP6).len() == 3
                && l.router_bfd_up() == 3)
                .then_some(())
        });
        if ok.is_none() {
            panic!(
                "the router never got 3 next hops per VIP: v4 {:?} v6 {:?}\n{}",
                l.router_nexthops(VIP4),
                l.router_nexthops(VIP6),
                l.diagnostics()
            );
        }
        l
    }

    pub fn frr_dir(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("frr-{node}"))
    }

    fn start_frr(&mut self, node: &str, config: &str) {
        let d = self.frr_dir(node);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("frr.conf"), config).unwrap();
        // FRR drops to its own user: it must read its config and create its sockets here.
        sh(&["chown", "-R", "frr:frr", d.to_str().unwrap()]);
        let ds = d.display().to_string();
        for daemon in FRR_DAEMONS {
            let mut args = vec![
                "-f".to_string(),
                format!("{ds}/frr.conf"),
                "--vty_socket".into(),
                ds.clone(),
                "-z".into(),
                format!("{ds}/zserv.api"),
                "-i".into(),
                format!("{ds}/{daemon}.pid"),
                "-P".into(),
                "0".into(),
                "--log".into(),
                format!("file:{ds}/{daemon}.log"),
            ];
            if daemon == "bfdd" {
                args.extend(["--bfdctl".into(), format!("{ds}/bfdd.sock")]);
            }
            let program = format!("/usr/lib/frr/{daemon}");
            let mut a: Vec<&str> = Vec::new();
            if daemon == "bfdd" {
                // BFD's 100 ms timers must not wait behind the rest of a loaded machine (the
                // labs share two cores with builds and benchmarks): real-time priority, as
                // BFD gets on routers. chrt execs bfdd, so the pid stays bfdd's.
                a.extend(["-f", "50", program.as_str()]);
            }
            a.extend(args.iter().map(String::as_str));
            let exe = if daemon == "bfdd" {
                "chrt".to_string()
            } else {
                program.clone()
            };
            self.lab.spawn(node, &format!("{daemon}-{node}"), exe, &a);
            if daemon == "zebra" {
                // bgpd and bfdd connect to zebra's socket at start.
                let sock = d.join("zserv.api");
                wait_for(Duration::from_secs(10), || sock.exists().then_some(())).unwrap_or_else(
                    || {
                        panic!(
                            "zebra of {node} did not start: {}",
                            self.lab.log(&format!("zebra-{node}"))
                        )
                    },
                );
            }
        }
    }

    /// Restart a LB node's FRR from its empty startup config (lbd must configure it again).
    pub fn restart_frr(&mut self, node: &str) {
        self.restart_frr_with(node, "");
    }

    /// Restart FRR on `node` with `extra` appended to its config (e.g. an operator's own
    /// `router bgp` section).
    pub fn restart_frr_with(&mut self, node: &str, extra: &str) {
        for d in FRR_DAEMONS.iter().rev() {
            self.lab.stop(&format!("{d}-{node}"), libc::SIGTERM);
        }
        let _ = std::fs::remove_file(self.frr_dir(node).join("zserv.api"));
        self.start_frr(node, &format!("hostname {node}\n{extra}"));
    }

    /// lbd's announcement routes (`ip route show proto 76`) on `node`, IPv4.
    pub fn announcement_routes(&self, node: &str) -> Vec<String> {
        let netns = self.lab.node(node).netns.clone();
        let out = lb_tests_sh(&["ip", "-n", &netns, "route", "show", "proto", "76"]);
        out.lines().map(str::to_string).collect()
    }

    pub fn flush_announcement_routes(&self, node: &str) {
        let netns = self.lab.node(node).netns.clone();
        lb_tests_sh(&["ip", "-n", &netns, "route", "flush", "proto", "76"]);
        lb_tests_sh(&["ip", "-n", &netns, "-6", "route", "flush", "proto", "76"]);
    }

    pub fn socket(&self, node: &str) -> String {
        self.lab
            .dir
            .join(format!("{node}.sock"))
            .display()
            .to_string()
    }
    fn config_path(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("{node}.toml"))
    }
    fn pin_name(&self, node: &str) -> String {
        format!("{}_{node}", self.lab.prefix.replace('-', "_"))
    }

    fn lbd_config(&self, i: usize, node: &str) -> String {
        let (v4, _) = lb_addr(i);
        let mut c = format!(
            "interface = \"eth0\"\nname = \"{}\"\napi_socket = \"{}\"\nxdp_mode = \"skb\"\n",
            self.pin_name(node),
            self.socket(node)
        );
        if let Some(h) = self.hold_ms {
            c += &format!("failed_backend_hold_ms = {h}\n");
        }
        if self.sync {
            let key = self.lab.dir.join("sync.key");
            if !key.exists() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::write(&key, "bgp-lab-cluster-key-0123456789abcdef01234567\n").unwrap();
                std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
            let peers: Vec<String> = (0..LB_NODES.len())
                .filter(|j| *j != i)
                .map(|j| format!("\"{}\"", lb_addr(j).0))
                .collect();
            c += &format!(
                "\n[sync]\npeers = [{}]\nkey_file = \"{}\"\ninterval_ms = 1000\n",
                peers.join(", "),
                key.display()
            );
        }
        c += &format!(
            "\n[[bgp]]\nasn = {LB_ASN}\nrouter_id = \"{v4}\"\nvtysh = \"{}\"\nvty_socket = \"{}\"\ncommunities = [\"{LB_ASN}:100\"]\n[bgp.bfd]\ntransmit_ms = {BFD_MS}\nreceive_ms = {BFD_MS}\nmultiplier = {BFD_MULT}\n[[bgp.peers]]\naddress = \"10.81.0.1\"\nasn = {ROUTER_ASN}\ndescription = \"router\"\n",
            self.vtysh_wrapper(node).display(),
            self.frr_dir(node).display()
        );
        for (vname, vip, v6) in [("web4", VIP4, false), ("web6", VIP6, true)] {
            c += &format!(
                "\n[[vips]]\nname = \"{vname}\"\naddress = \"{vip}\"\nports = [{PORT}]\nannounce = \"bgp\"\n[vips.health]\nkind = \"tcp\"\ninterval_ms = 200\n"
            );
            for (n, w) in BACKENDS {
                let b = self.lab.node(n);
                let a = if v6 { &b.v6 } else { &b.v4 };
                c += &format!("[[vips.backends]]\naddress = \"{a}\"\nweight = {w}\n");
            }
        }
        c
    }

    /// The vtysh lbd runs on `node`: FRR's own, unless [`BgpLab::hang_vtysh`] made it hang.
    fn vtysh_wrapper(&self, node: &str) -> PathBuf {
        let path = self.lab.dir.join(format!("vtysh-{node}"));
        if !path.exists() {
            use std::os::unix::fs::PermissionsExt;
            let m = path.display();
            std::fs::write(
                &path,
                format!(
                    "#!/bin/sh\n# lab: vtysh, or a hung one while {m}.hang exists (reads only)\nif [ -e {m}.hang ]; then\n  for a in \"$@\"; do\n    if [ \"$a\" = \"show running-config\" ]; then touch {m}.hung; exec sleep 60; fi\n  done\nfi\nexec vtysh \"$@\"\n"
                ),
            )
            .unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        path
    }

    /// From now on `node`'s lbd finds FRR hung: its reads of the running config (the periodic
    /// check, and a configure's first step) never answer. Returns once one such read is
    /// hanging (within the check's period).
    pub fn hang_vtysh(&self, node: &str, timeout: Duration) -> bool {
        let m = self.lab.dir.join(format!("vtysh-{node}"));
        std::fs::write(m.with_extension("hang"), b"").unwrap();
        wait_for(timeout, || m.with_extension("hung").exists().then_some(())).is_some()
    }

    /// FRR answers `node`'s lbd again.
    pub fn unhang_vtysh(&self, node: &str) {
        let m = self.lab.dir.join(format!("vtysh-{node}"));
        let _ = std::fs::remove_file(m.with_extension("hang"));
        let _ = std::fs::remove_file(m.with_extension("hung"));
    }

    pub fn start_lbd(&mut self, node: &str) {
        let cfg = self.config_path(node).display().to_string();
        self.lab
            .cleanup(PathBuf::from("/sys/fs/bpf").join(self.pin_name(node)));
        self.lab.spawn(
            node,
            &format!("lbd-{node}"),
            bin_dir().join("lbd"),
            &["--config", &cfg],
        );
    }

    pub fn vtysh(&self, node: &str, cmd: &str) -> String {
        let out = Command::new("vtysh")
            .arg("--vty_socket")
            .arg(self.frr_dir(node))
            .args(["-c", cmd])
            .output()
            .expect("run vtysh");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The router's installed (FIB) next hops for a VIP host route.
    pub fn router_nexthops(&self, vip: &str) -> Vec<String> {
        let (af, len) = if vip.contains(':') {
            ("ipv6", 128)
        } else {
            ("ip", 32)
        };
        let prefix = format!("{vip}/{len}");
        let v: Value =
            serde_json::from_str(&self.vtysh("router", &format!("show {af} route {prefix} json")))
                .unwrap_or(Value::Null);
        let mut out: Vec<String> = v[&prefix]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["selected"] == true)
            .flat_map(|r| r["nexthops"].as_array().cloned().unwrap_or_default())
            .filter(|n| n["fib"] == true)
            .filter_map(|n| n["ip"].as_str().map(str::to_string))
            .collect();
        out.sort();
        out
    }

    /// BFD sessions the router has up.
    pub fn router_bfd_up(&self) -> usize {
        let v: Value = serde_json::from_str(&self.vtysh("router", "show bfd peers json"))
            .unwrap_or(Value::Null);
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"] == "up")
            .count()
    }

    /// Wait until the router has exactly `n` next hops for both VIPs; how long it took.
    pub fn wait_nexthops(&self, n: usize, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        wait_for(timeout, || {
            (self.router_nexthops(VIP4).len() == n && self.router_nexthops(VIP6).len() == n)
                .then(|| start.elapsed())
        })
    }

    pub fn lbctl(&self, node: &str, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket(node), args)
    }

    /// Packets lbd counted for every VIP service on `node`.
    pub fn vip_packets(&self, node: &str) -> u64 {
        self.lbctl(node, &["vips", "list"])
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|r| r["packets"].as_u64().unwrap_or(0))
            .sum()
    }

    /// A node dies the way a hung or powered-off host behind a switch does: nothing it had
    /// runs any more (lbd and FRR killed, the XDP program gone), it drops every frame, and its
    /// link stays up, so only BFD can tell the router. (Taking the link down instead makes the
    /// lab's bridge flush the node's MAC and flood its frames to the other LB nodes, which
    /// hides the failure.)
    pub fn kill_node(&mut self, node: &str) {
        // Silence first: a killed bgpd's socket would otherwise send the router a FIN, a
        // clean session close that withdraws the routes at once (no BFD needed). A dead host
        // sends nothing.
        let netns = self.lab.node(node).netns.clone();
        let ns = format!("--net=/run/netns/{netns}");
        sh(&[
            "nsenter",
            &ns,
            "nft",
            "add table netdev lbdead ; add chain netdev lbdead in { type filter hook ingress device eth0 priority -500 ; policy drop ; } ; add table inet lbdead ; add chain inet lbdead out { type filter hook output priority -500 ; policy drop ; }",
        ]);
        // Generic XDP runs before the ingress hook: remove the program (unpinning its link),
        // once lbd is gone (teardown refuses to run beside a live lbd). Whatever lbd's guardian
        // does meanwhile stays on the node: the filters drop everything it sends.
        self.lab.stop(&format!("lbd-{node}"), libc::SIGKILL);
        let cfg = self.config_path(node).display().to_string();
        sh(&[
            bin_dir().join("lbd").to_str().unwrap(),
            "--config",
            &cfg,
            "teardown",
        ]);
        for d in FRR_DAEMONS {
            self.lab.stop(&format!("{d}-{node}"), libc::SIGKILL);
        }
    }

    /// `labnode ARGS...` run in the client namespace; its JSON.
    pub fn client(&self, args: &[&str]) -> Value {
        let out = self
            .lab
            .cmd("client", bin_dir().join("labnode"))
            .args(args)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "labnode {args:?}: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Start `labnode ARGS...` in the client namespace in the background.
    pub fn client_spawn(&self, args: &[&str]) -> std::process::Child {
        self.lab
            .cmd("client", bin_dir().join("labnode"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    /// An LB node dies while long-lived connections and a stream of new ones run through the
    /// VIP: what the client saw.
    pub fn node_death(&mut self, node: &str) -> NodeDeath {
        const LONG: u64 = 24;
        let hold = self.client_spawn(&["hold-ids", VIP4, PORT, &LONG.to_string(), "9", "100", "5"]);
        // Short timeout, many threads: a SYN into the dead node is lost (its retransmission
        // 1 s later would hide the failure) and blocks its thread until the timeout, so the
        // window is sampled by every thread every 150 ms at worst.
        let short = self.client_spawn(&["connect-for", VIP4, PORT, "7", "24", "150"]);
        // The router's FIB changes, timestamped by the kernel side (`ip -ts monitor`).
        let monitor = self
            .lab
            .cmd("router", "ip")
            .args(["-ts", "monitor", "route"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let killed_at = epoch_ms();
        self.kill_node(node);
        let withdrawn = self.wait_nexthops(LB_NODES.len() - 1, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(200));
        let pid = monitor.id() as i32;
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let routes =
            String::from_utf8_lossy(&monitor.wait_with_output().unwrap().stdout).to_string();
        let fib_changed_ms = routes
            .lines()
            .filter(|l| l.contains(VIP4))
            .filter_map(monitor_time_ms)
            .find(|t| *t >= killed_at)
            .map(|t| (t - killed_at) as f64);
        let hold = child_json(hold);
        let short = child_json(short);
        let fails: Vec<u128> = short["fail_at_ms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_u64().map(u128::from))
            .collect();
        let survived: u64 = crate::sum_counts(&hold["survived_by_id"]);
        NodeDeath {
            new_failed_ms: fails
                .iter()
                .filter(|t| **t >= killed_at)
                .max()
                .map(|t| (t - killed_at) as f64)
                .unwrap_or(0.0),
            failed_before_kill: fails.iter().filter(|t| **t < killed_at).count() as u64,
            new_ok: short["ok"].as_u64().unwrap_or(0),
            new_failed: short["failed"].as_u64().unwrap_or(0),
            long_lived: LONG,
            long_lived_lost: LONG - survived.min(LONG),
            withdrawn_after_ms: withdrawn.map(|d| d.as_secs_f64() * 1000.0),
            fib_changed_ms,
            client_long: hold,
        }
    }

    /// What to print when something is off: router routes, sessions, lbd logs.
    pub fn diagnostics(&self) -> String {
        let mut s = format!(
            "router bgp:\n{}\nrouter bfd:\n{}\n",
            self.vtysh("router", "show bgp summary"),
            self.vtysh("router", "show bfd peers brief")
        );
        for n in LB_NODES {
            s += &format!(
                "--- {n} lbctl bgp status: {:?}\n--- {n} lbd log (tail):\n{}\n",
                self.lbctl(n, &["bgp", "status"]),
                tail(&self.lab.log(&format!("lbd-{n}")), 15)
            );
        }
        s
    }
}

impl Default for BgpLab {
    fn default() -> Self {
        Self::new()
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The client sits on its own link behind the router (eth1 there).
fn add_client(lab: &mut Lab, router: &Node) {
    let netns = format!("{}-client", lab.prefix);
    sh(&["ip", "netns", "add", &netns]);
    sh(&[
        "ip",
        "-n",
        &router.netns,
        "link",
        "add",
        "eth1",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &netns,
    ]);
    let node = Node {
        name: "client".into(),
        netns: netns.clone(),
        v4: "10.82.0.2".into(),
        v6: "fd82::2".into(),
        mac: String::new(),
    };
    lab.nodes.insert("client".into(), node);
    for (k, v) in [
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
        // Thousands of short connections a second: without these the client's ephemeral ports
        // fill with TIME_WAIT and connect() itself becomes the bottleneck.
        ("net.ipv4.ip_local_port_range", "1024 65000"),
        ("net.ipv4.tcp_tw_reuse", "1"),
    ] {
        lab.sysctl(&netns, k, v);
    }
    for (ns, dev, v4, v6) in [
        (&router.netns, "eth1", "10.82.0.1/24", "fd82::1/64"),
        (&netns, "eth0", "10.82.0.2/24", "fd82::2/64"),
    ] {
        sh(&["ip", "-n", ns, "addr", "add", v4, "dev", dev]);
        sh(&["ip", "-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
        sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }
    sh(&[
        "ip",
        "-n",
        &netns,
        "route",
        "add",
        "default",
        "via",
        "10.82.0.1",
    ]);
    sh(&[
        "ip", "-n", &netns, "-6", "route", "add", "default", "via", "fd82::1",
    ]);
}

/// The upstream router: eBGP to the three LB nodes with BFD, up to 8 ECMP paths per prefix.
fn router_config() -> String {
    let mut c = format!(
        "frr defaults datacenter\nhostname router\nrouter bgp {ROUTER_ASN}\n bgp router-id 10.81.0.1\n no bgp ebgp-requires-policy\n neighbor lbs peer-group\n neighbor lbs remote-as {LB_ASN}\n neighbor lbs bfd profile fast\n"
    );
    for i in 0..LB_NODES.len() {
        c += &format!(" neighbor {} peer-group lbs\n", lb_addr(i).0);
    }
    c += " address-family ipv4 unicast\n  maximum-paths 8\n exit-address-family\n address-family ipv6 unicast\n  neighbor lbs activate\n  maximum-paths 8\n exit-address-family\n";
    // Last: each daemon reads the whole file and skips other daemons' commands, so nothing may
    // follow a section one daemon does not know (its `exit` would leave config mode there).
    c += &format!(
        "bfd\n profile fast\n  receive-interval {BFD_MS}\n  transmit-interval {BFD_MS}\n  detect-multiplier {BFD_MULT}\n"
    );
    c
}

/// What a client saw when an LB node died.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeDeath {
    /// From the kill to the start of the last new connection that failed (0: none failed).
    pub new_failed_ms: f64,
    pub failed_before_kill: u64,
    pub new_ok: u64,
    pub new_failed: u64,
    pub long_lived: u64,
    pub long_lived_lost: u64,
    /// From the kill until a poll of the router's vtysh showed the next hop gone (an upper
    /// bound: each poll costs two vtysh runs).
    pub withdrawn_after_ms: Option<f64>,
    /// From the kill until the router's kernel route for the IPv4 VIP changed (`ip monitor`).
    pub fib_changed_ms: Option<f64>,
    pub client_long: Value,
}

fn epoch_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// The JSON a `labnode` child printed.
pub fn child_json(c: std::process::Child) -> Value {
    let out = c.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The time of an `ip -ts monitor` line (`[2026-11-22T03:10:01.123456] ...`, local time) in ms
/// since the Unix epoch.
fn monitor_time_ms(line: &str) -> Option<u128> {
    let ts = line.strip_prefix('[')?.split(']').next()?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (proleptic Gregorian), UTC: the labs run with TZ unset.
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms = ((days * 86_400 + h * 3600 + min * 60) as f64 + sec) * 1000.0;
    Some(ms as u128)
}

fn lb_tests_sh(args: &[&str]) -> String {
    String::from_utf8_lossy(&crate::lab::try_sh(args).stdout).into_owned()
}
