//! A cluster-shaped lab for VRRP: N nodes on one bridge, each running lbd (VRRP instance "api"
//! for one VIP) or a real keepalived in the same instance, plus a `labnode serve-id` backend on
//! every node and a client. Every node is a DSR backend of the VIP (lbd holds it on lo; for a
//! keepalived node the lab does that when lbd nodes are present); the lbd master forwards with
//! XDP, a keepalived master serves the VIP itself.
//!
//! Node failure is simulated by taking the node's link down and killing its daemon with
//! SIGKILL: killing lbd alone does not interrupt forwarding (the pinned XDP program keeps
//! working), and lbd's guardian takes the VIP off the dead daemon's interface at once (a node
//! whose link is down keeps it, as a dead node would).

use std::{
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::{
    bin_dir,
    keepalived_haproxy::{Globals, Instance, Listen, global_defs, haproxy_cfg, vrrp_script},
    lab::{Lab, sh, try_sh, wait_for},
};

pub const VIP4: &str = "10.78.0.100";
pub const VIP6: &str = "fd78::100";
pub const PORT: &str = "8080";
pub const VRID: u8 = 51;

/// How one node's VRRP speaker is configured.
#[derive(Clone, Debug)]
pub struct NodeOpts {
    pub priority: u8,
    pub preempt: bool,
    pub version: u8,
    pub advert_ms: u32,
    pub unicast: bool,
    pub ipv6: bool,
    pub auth_pass: Option<String>,
    /// Run a real keepalived (Debian package) instead of lbd on this node.
    pub keepalived: bool,
    /// The VIP this node's instance carries, if not the lab's (a VRID collision).
    pub vip: Option<&'static str>,
    /// lbd: a VRRPv3 instance that also speaks VRRPv2 (a version migration).
    pub v2_compat: bool,
    /// lbd: top-level config lines put before everything else.
    pub top: String,
    /// lbd: lines appended to the `[[vrrp]]` entry.
    pub vrrp_extra: String,
    /// lbd: the backends' TCP check interval.
    pub health_interval_ms: u32,
    /// keepalived: haproxy in front, as on OpenShift: VIP:PORT is redirected (nftables) to
    /// haproxy on 9445, which balances over every node's server with `check inter 5s fall 3
    /// rise 1`. Without it the keepalived owner serves the VIP itself.
    pub haproxy: bool,
    /// keepalived: a tracked script that always passes, adding this weight (OpenShift tracks
    /// haproxy and apiserver readiness: +20, +5, +3 on an equal base priority).
    pub track_weight: Option<i32>,
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
            keepalived: false,
            vip: None,
            v2_compat: false,
            top: String::new(),
            vrrp_extra: String::new(),
            health_interval_ms: 200,
            haproxy: false,
            track_weight: None,
        }
    }
}

impl NodeOpts {
    /// keepalived as OpenShift renders it: VRRPv2, advert_int 1, PASS auth, unicast peers.
    pub fn openshift_keepalived(priority: u8) -> NodeOpts {
        NodeOpts {
            priority,
            version: 2,
            advert_ms: 1000,
            unicast: true,
            auth_pass: Some(OPENSHIFT_PASS.into()),
            keepalived: true,
            ..Default::default()
        }
    }

    /// lbd configured to join such an instance.
    pub fn openshift_lbd(priority: u8) -> NodeOpts {
        NodeOpts {
            keepalived: false,
            ..NodeOpts::openshift_keepalived(priority)
        }
    }
}

/// `<cluster>_api_vip` cut to the 8 bytes that go on the wire (cluster "ostest").
pub const OPENSHIFT_PASS: &str = "ostest_a";

pub struct VrrpLab {
    pub lab: Lab,
    pub nodes: Vec<String>,
    pub opts: Vec<NodeOpts>,
    pub vip: &'static str,
    /// The device the VIP lives on in every node (`eth0`; `br-ex` in the br-ex lab).
    pub vip_dev: String,
    labnode: String,
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl VrrpLab {
    /// Nodes n1..nN with the given options, and a client. lbd (or keepalived) is started on
    /// every node.
    pub fn new(labnode: &str, opts: Vec<NodeOpts>) -> VrrpLab {
        let mut l = VrrpLab::prepare(labnode, opts);
        for i in 0..l.nodes.len() {
            l.start(i);
        }
        l
    }

    /// As [`VrrpLab::new`] without starting any VRRP speaker.
    pub fn prepare(labnode: &str, opts: Vec<NodeOpts>) -> VrrpLab {
        let ipv6 = opts.first().map(|o| o.ipv6).unwrap_or(false);
        let mut lab = Lab::new("vr");
        let client = lab.add_node("client", "10.78.0.1", "fd78::1");
        // The client opens thousands of short connections a second: with the default port range
        // it runs out of ports (EADDRNOTAVAIL) before anything under test fails.
        lab.sysctl(&client.netns, "net.ipv4.ip_local_port_range", "1024 65000");
        lab.sysctl(&client.netns, "net.ipv4.tcp_tw_reuse", "1");
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
        let any_lbd = opts.iter().any(|o| !o.keepalived);
        let l = VrrpLab {
            lab,
            nodes,
            opts,
            vip,
            vip_dev: "eth0".into(),
            labnode: labnode.to_string(),
        };
        for i in 0..l.nodes.len() {
            if l.opts[i].keepalived {
                // Next to lbd nodes a keepalived node is a DSR backend too, as lbd nodes are.
                if any_lbd {
                    l.lab.make_dsr_backend(&l.nodes[i], &[l.node_vip(i)]);
                }
                std::fs::write(l.keepalived_conf_path(i), l.keepalived_config(i)).unwrap();
            } else {
                l.write_config(i);
            }
        }
        l
    }

    /// A node's address in the VIP's family.
    pub fn addr(&self, node: &str) -> String {
        let n = self.lab.node(node);
        if self.vip.contains(':') {
            n.v6.clone()
        } else {
            n.v4.clone()
        }
    }

    /// The VIP node `i`'s instance carries.
    pub fn node_vip(&self, i: usize) -> &'static str {
        self.opts[i].vip.unwrap_or(self.vip)
    }

    pub fn socket(&self, i: usize) -> String {
        self.lab
            .dir
            .join(format!("{}.sock", self.nodes[i]))
            .display()
            .to_string()
    }

    /// `lbd --config <node i's config> ARGS` run in node `i` (e.g. `teardown`), to its end.
    pub fn lbd(&self, i: usize, args: &[&str]) -> std::process::Output {
        let cfg = self.config_path(i).display().to_string();
        self.lab
            .cmd(&self.nodes[i], bin_dir().join("lbd"))
            .args(["--config", &cfg])
            .args(args)
            .output()
            .unwrap()
    }

    /// `GET path` on node `i`'s API socket: (status, body); status 0 when nothing answered.
    pub fn get(&self, i: usize, path: &str) -> (u16, String) {
        let out = crate::lab::try_sh(&[
            "curl",
            "-s",
            "-m",
            "15",
            "-w",
            "\n%{http_code}",
            "--unix-socket",
            &self.socket(i),
            &format!("http://lbd{path}"),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    pub fn config_path(&self, i: usize) -> PathBuf {
        self.lab.dir.join(format!("{}.toml", self.nodes[i]))
    }

    fn keepalived_conf_path(&self, i: usize) -> PathBuf {
        self.lab.dir.join(format!("ka-{}.conf", self.nodes[i]))
    }

    fn keepalived_pid_paths(&self, i: usize) -> (PathBuf, PathBuf) {
        let n = &self.nodes[i];
        (
            self.lab.dir.join(format!("ka-{n}.pid")),
            self.lab.dir.join(format!("ka-{n}-vrrp.pid")),
        )
    }

    fn pin_name(&self, i: usize) -> String {
        format!("{}_{}", self.lab.prefix.replace('-', "_"), self.nodes[i])
    }

    fn peers(&self, i: usize) -> Vec<String> {
        let me = &self.nodes[i];
        self.nodes
            .iter()
            .filter(|n| *n != me)
            .map(|n| self.addr(n))
            .collect()
    }

    /// The lbd config of node `i` from its options.
    pub fn config(&self, i: usize) -> String {
        let o = &self.opts[i];
        let vip = self.node_vip(i);
        let mut c = o.top.clone();
        c += &format!(
            "interface = \"{}\"\nname = \"{}\"\napi_socket = \"{}\"\nxdp_mode = \"skb\"\n",
            self.vip_dev,
            self.pin_name(i),
            self.socket(i)
        );
        c += &format!(
            "\n[[vips]]\nname = \"api\"\naddress = \"{vip}\"\nports = [{PORT}]\nvrrp = \"api\"\n[vips.health]\nkind = \"tcp\"\ninterval_ms = {}\n",
            o.health_interval_ms
        );
        for n in &self.nodes {
            c += &format!("[[vips.backends]]\naddress = \"{}\"\n", self.addr(n));
        }
        c += &format!(
            "\n[[vrrp]]\nname = \"api\"\nvrid = {VRID}\nversion = {}\npriority = {}\nadvert_interval_ms = {}\npreempt = {}\nvips = [\"{vip}\"]\n",
            o.version, o.priority, o.advert_ms, o.preempt
        );
        if let Some(p) = &o.auth_pass {
            c += &format!("auth_pass = \"{p}\"\n");
        }
        if o.v2_compat {
            c += "v2_compat = true\n";
        }
        c += &o.vrrp_extra;
        if o.unicast {
            let peers: Vec<String> = self.peers(i).iter().map(|p| format!("\"{p}\"")).collect();
            c += &format!(
                "unicast_src = \"{}\"\nunicast_peers = [{}]\n",
                self.addr(&self.nodes[i]),
                peers.join(", ")
            );
        }
        c
    }

    /// keepalived.conf of node `i`, shaped like OpenShift's template (one API instance).
    pub fn keepalived_config(&self, i: usize) -> String {
        let o = &self.opts[i];
        let vip = self.node_vip(i);
        let prefix = if vip.contains(':') { 128 } else { 32 };
        let mut c = global_defs(&Globals {
            router_id: Some(&self.nodes[i]),
            version: Some(o.version),
            scripts: o.track_weight.is_some(),
            ..Default::default()
        });
        if let Some(w) = o.track_weight {
            c += &vrrp_script("chk_ready", "/bin/true", 1, Some(w), 1, 1);
        }
        c += &Instance {
            name: "ostest_API",
            interface: "eth0",
            vrid: VRID,
            priority: o.priority,
            advert: (f64::from(o.advert_ms) / 1000.0).to_string(),
            preempt: o.preempt,
            unicast: o
                .unicast
                .then(|| (self.addr(&self.nodes[i]), self.peers(i))),
            auth_pass: o.auth_pass.clone(),
            vip: format!("{vip}/{prefix}"),
            // IPv4 VIPs carry a label as OpenShift's do; IPv6 addresses have none.
            label: (!vip.contains(':')).then(|| "eth0:vip".to_string()),
            track_scripts: if o.track_weight.is_some() {
                vec!["chk_ready"]
            } else {
                Vec::new()
            },
        }
        .render();
        c
    }

    /// Write node `i`'s keepalived.conf from its options (a node going back to keepalived).
    pub fn write_keepalived_config(&self, i: usize) {
        std::fs::write(self.keepalived_conf_path(i), self.keepalived_config(i)).unwrap();
    }

    pub fn write_config(&self, i: usize) {
        std::fs::write(self.config_path(i), self.config(i)).unwrap();
    }

    fn tag(&self, i: usize) -> String {
        let n = &self.nodes[i];
        if self.opts[i].keepalived {
            format!("ka-{n}")
        } else {
            format!("lbd-{n}")
        }
    }

    /// The log of node `i`'s VRRP speaker.
    pub fn log(&self, i: usize) -> String {
        self.lab.log(&self.tag(i))
    }

    /// All speakers' logs, for failure messages.
    pub fn logs(&self) -> String {
        (0..self.nodes.len())
            .map(|i| format!("---- {} ----\n{}", self.tag(i), self.log(i)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Start lbd (log tag `lbd-<node>`) or keepalived (`ka-<node>`) on node `i`.
    pub fn start(&mut self, i: usize) {
        let n = self.nodes[i].clone();
        let tag = self.tag(i);
        if self.opts[i].keepalived {
            let conf = self.keepalived_conf_path(i).display().to_string();
            let (pid, vrrp_pid) = self.keepalived_pid_paths(i);
            let (pid, vrrp_pid) = (pid.display().to_string(), vrrp_pid.display().to_string());
            // -n: stay in the foreground (so the lab tracks it); -P: VRRP only; -l -D -G:
            // detailed log on the console (the lab's log file), no syslog.
            if self.opts[i].haproxy {
                self.start_haproxy(i);
            }
            self.lab.spawn(
                &n,
                &tag,
                "keepalived",
                &[
                    "-n", "-P", "-l", "-D", "-G", "-f", &conf, "-p", &pid, "-r", &vrrp_pid,
                ],
            );
            return;
        }
        let cfg = self.config_path(i).display().to_string();
        self.lab
            .cleanup(PathBuf::from("/sys/fs/bpf").join(self.pin_name(i)));
        self.lab
            .spawn(&n, &tag, bin_dir().join("lbd"), &["--config", &cfg]);
    }

    /// haproxy on keepalived node `i` as OpenShift runs it in front of the apiservers (TCP,
    /// round robin, `inter 5s fall 3 rise 1`), reached through an nftables redirect of
    /// VIP:PORT to 9445 (on the owner, which holds the VIP).
    fn start_haproxy(&mut self, i: usize) {
        let n = self.nodes[i].clone();
        let tag = format!("haproxy-{n}");
        if self.lab.pid(&tag).is_some() {
            return;
        }
        let cfg = haproxy_cfg(
            "30s",
            &[Listen {
                name: "api",
                bind: ":::9445 v4v6".into(),
                readyz_tls_port: None,
                servers: self
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(k, node)| (format!("s{k}"), format!("{}:{PORT}", self.addr(node))))
                    .collect(),
            }],
        );
        let path = self.lab.dir.join(format!("haproxy-{n}.cfg"));
        std::fs::write(&path, cfg).unwrap();
        let netns = self.lab.node(&n).netns.clone();
        let (family, daddr) = if self.vip.contains(':') {
            ("ip6", "ip6 daddr")
        } else {
            ("ip", "ip daddr")
        };
        let rules = format!(
            "table {family} lbt {{\n  chain pre {{\n    type nat hook prerouting priority -100;\n    {daddr} {} tcp dport {PORT} redirect to :9445\n  }}\n}}\n",
            self.vip
        );
        let rules_path = self.lab.dir.join(format!("nft-{n}.conf"));
        std::fs::write(&rules_path, rules).unwrap();
        let _ = try_sh(&[
            "nsenter",
            &format!("--net=/run/netns/{netns}"),
            "nft",
            "delete",
            "table",
            family,
            "lbt",
        ]);
        sh(&[
            "nsenter",
            &format!("--net=/run/netns/{netns}"),
            "nft",
            "-f",
            &rules_path.display().to_string(),
        ]);
        let path = path.display().to_string();
        self.lab.spawn(&n, &tag, "haproxy", &["-db", "-f", &path]);
    }

    /// keepalived's VRRP child of node `i`, if running (from its pid file, checked).
    fn keepalived_child(&self, i: usize) -> Option<i32> {
        let (_, vrrp_pid) = self.keepalived_pid_paths(i);
        let pid: i32 = std::fs::read_to_string(vrrp_pid)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let conf = self.keepalived_conf_path(i).display().to_string();
        String::from_utf8_lossy(&cmdline)
            .contains(&conf)
            .then_some(pid)
    }

    /// Stop node `i`'s speaker with `signal` and wait for it (SIGKILL: crash; SIGTERM:
    /// graceful, lbd and keepalived send priority 0). A crashed keepalived's VRRP child is
    /// killed too.
    pub fn stop(&mut self, i: usize, signal: i32) {
        // The parent first (so it cannot respawn the child), then its VRRP child.
        let child = self.opts[i]
            .keepalived
            .then(|| self.keepalived_child(i))
            .flatten();
        let tag = self.tag(i);
        self.lab.stop(&tag, signal);
        if self.opts[i].haproxy {
            self.lab.stop(&format!("haproxy-{}", self.nodes[i]), signal);
        }
        if let Some(pid) = child {
            if signal == libc::SIGKILL {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = wait_for(Duration::from_secs(5), || {
                self.keepalived_child(i).is_none().then_some(())
            });
        }
    }

    /// Run `labnode vrrp-send` (at `labnode`) in the client, the foreign router, with `args`
    /// after its interface and source address; wait for it and return how many adverts it sent.
    pub fn vrrp_send_from_client(&mut self, labnode: &str, tag: &str, args: &[&str]) -> u64 {
        let src = self.lab.node("client").v4.clone();
        let mut all = vec!["vrrp-send", "eth0", src.as_str()];
        all.extend_from_slice(args);
        self.lab.spawn("client", tag, labnode, &all);
        let status = self.lab.wait(tag, Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| s.success()),
            "{tag}: {}",
            self.lab.log(tag)
        );
        let log = self.lab.log(tag);
        let line = log.lines().rev().find(|x| x.starts_with('{')).unwrap_or("");
        serde_json::from_str::<Value>(line).unwrap_or_default()["sent"]
            .as_u64()
            .unwrap_or(0)
    }

    /// CPU time (user + system, seconds) node `i`'s speaker has used so far.
    pub fn cpu_seconds(&self, i: usize) -> Option<f64> {
        let pid = self.lab.pid(&self.tag(i))?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces): utime is the 12th, stime 13th.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Some(ticks as f64 / hz)
    }

    /// Node `i`'s speaker's threads: (name, scheduling policy, real-time priority), from
    /// `/proc/PID/task/TID/stat` (fields 40 and 41).
    pub fn threads(&self, i: usize) -> Vec<(String, u32, u32)> {
        let Some(pid) = self.lab.pid(&self.tag(i)) else {
            return Vec::new();
        };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for t in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = stat[open + 1..close].to_string();
            // Fields after the name start at field 3 (state): rt_priority is field 40,
            // policy field 41.
            let f: Vec<&str> = stat[close + 2..].split(' ').collect();
            let num = |k: usize| f.get(k).and_then(|v| v.parse::<u32>().ok());
            if let (Some(prio), Some(policy)) = (num(37), num(38)) {
                out.push((name, policy, prio));
            }
        }
        out
    }

    /// Send `signal` to node `i`'s speaker without waiting; the unix time in ms it was sent.
    pub fn signal(&self, i: usize, signal: i32) -> u64 {
        let pid = self.lab.pid(&self.tag(i)).expect("speaker running");
        let at = unix_ms();
        unsafe { libc::kill(pid as i32, signal) };
        at
    }

    /// Set node `i`'s eth0 up or down.
    pub fn set_link(&self, i: usize, up: bool) {
        let netns = &self.lab.node(&self.nodes[i]).netns;
        sh(&[
            "ip",
            "-n",
            netns,
            "link",
            "set",
            "eth0",
            if up { "up" } else { "down" },
        ]);
    }

    /// Node failure: the link goes down first (nothing more leaves the node, not even a
    /// priority-0 advert), then the speaker is killed with SIGKILL.
    pub fn fail_node(&mut self, i: usize) {
        self.set_link(i, false);
        self.stop(i, libc::SIGKILL);
    }

    /// Bring a failed node back: the VIP a crashed speaker left is gone as after a reboot for
    /// keepalived (lbd removes its stale VIPs itself), the link comes up, the speaker starts.
    pub fn restore_node(&mut self, i: usize) {
        if self.opts[i].keepalived {
            let netns = self.lab.node(&self.nodes[i]).netns.clone();
            let vip = self.node_vip(i);
            let cidr = if vip.contains(':') {
                format!("{vip}/128")
            } else {
                format!("{vip}/32")
            };
            let _ = try_sh(&["ip", "-n", &netns, "addr", "del", &cidr, "dev", "eth0"]);
        }
        self.set_link(i, true);
        self.start(i);
    }

    pub fn lbctl(&self, i: usize, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket(i), args)
    }

    /// `lbctl vrrp status` of node `i`'s (only) instance.
    pub fn status(&self, i: usize) -> Option<Value> {
        let v = self.lbctl(i, &["vrrp", "status"])?;
        Some(v[0].clone())
    }

    /// Whether node `i` holds the VIP on its VIP device (what a master, lbd or keepalived,
    /// does).
    pub fn holds_vip(&self, i: usize) -> bool {
        let netns = &self.lab.node(&self.nodes[i]).netns;
        crate::lab::has_address(netns, &self.vip_dev, self.node_vip(i))
    }

    /// VRRP state of node `i` ("master", "backup", ...): lbd's from lbctl; keepalived's from
    /// whether it holds the VIP and its log (not running: None).
    pub fn state(&self, i: usize) -> Option<String> {
        if self.opts[i].keepalived {
            self.lab.pid(&self.tag(i))?;
            let last = self
                .log(i)
                .lines()
                .rev()
                .find_map(|l| {
                    ["MASTER", "BACKUP", "FAULT"]
                        .into_iter()
                        .find(|s| l.contains(&format!("Entering {s} STATE")))
                })
                .map(str::to_lowercase);
            return match last.as_deref() {
                Some("master") if self.holds_vip(i) => Some("master".into()),
                Some("master") => Some("becoming-master".into()),
                other => other.map(String::from),
            };
        }
        let v = self.status(i)?;
        v["state"].as_str().map(|s| s.to_lowercase())
    }

    /// State transitions so far: lbd's counter, or keepalived's "Entering ... STATE" lines.
    pub fn transitions(&self, i: usize) -> Option<u64> {
        if self.opts[i].keepalived {
            return Some(
                self.log(i)
                    .lines()
                    .filter(|l| l.contains("Entering ") && l.contains(" STATE"))
                    .count() as u64,
            );
        }
        self.status(i)?["counters"]["transitions"].as_u64()
    }

    /// Indexes of nodes that say they are master.
    pub fn masters(&self, running: &[usize]) -> Vec<usize> {
        running
            .iter()
            .copied()
            .filter(|i| self.state(*i).as_deref() == Some("master"))
            .collect()
    }

    /// Wait until node `i` says it is master.
    pub fn wait_master(&self, i: usize, timeout: Duration) -> bool {
        wait_for(timeout, || {
            (self.state(i).as_deref() == Some("master")).then_some(())
        })
        .is_some()
    }

    /// Indexes of nodes holding the VIP on eth0.
    pub fn holders(&self, nodes: &[usize]) -> Vec<usize> {
        nodes
            .iter()
            .copied()
            .filter(|i| self.holds_vip(*i))
            .collect()
    }

    /// Wait until exactly one of `running` is master and the others backup, and it stays so for
    /// a few advert intervals (a preempting node may still be on its way); returns the master.
    pub fn wait_one_master(&self, running: &[usize], timeout: Duration) -> Option<usize> {
        let start = Instant::now();
        let settle = self.settle_time(running);
        loop {
            let first = self.one_master_now(running, timeout.saturating_sub(start.elapsed()))?;
            std::thread::sleep(settle);
            let again = self.one_master_now(running, timeout.saturating_sub(start.elapsed()))?;
            if first == again {
                return Some(again);
            }
            if start.elapsed() > timeout {
                return None;
            }
        }
    }

    /// Long enough for a (re)started node to preempt: its master-down interval (3 adverts plus
    /// at most one of skew) of the slowest node, and some slack.
    fn settle_time(&self, running: &[usize]) -> Duration {
        let ms = running
            .iter()
            .map(|i| self.opts[*i].advert_ms)
            .max()
            .unwrap_or(100);
        Duration::from_millis(u64::from(ms) * 9 / 2).max(Duration::from_millis(800))
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
            let holders = self.holders(running);
            (masters.len() == 1 && backups == running.len() - 1 && holders == masters)
                .then(|| masters[0])
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

    /// Short connections from the client for `secs` seconds (one at a time): (ok, failed).
    pub fn probe_for(&self, secs: u64, timeout_ms: u64) -> (u64, u64) {
        let out = self
            .lab
            .cmd("client", &self.labnode)
            .args([
                "connect-for",
                self.vip,
                PORT,
                &secs.to_string(),
                "1",
                &timeout_ms.to_string(),
            ])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if v["failed"] != 0 {
            // What failed and when: the evidence a failing lab assertion needs.
            eprintln!("probes: {v}");
        }
        (
            v["ok"].as_u64().unwrap_or(0),
            v["failed"].as_u64().unwrap_or(u64::MAX),
        )
    }

    /// Wait until the client gets answers through the VIP.
    pub fn wait_serving(&self, timeout: Duration) -> bool {
        wait_for(timeout, || self.probe(300).map(|_| ())).is_some()
    }

    /// Time from now until the client first gets an answer through the VIP (a failover
    /// measurement: call right after failing the master). See [`VrrpLab::answered_since`].
    pub fn time_to_answer(&self, limit: Duration) -> Option<Duration> {
        self.answered_since(Instant::now(), limit)
    }

    /// One connection to the VIP from the client (200 ms timeout), its answer on stdout.
    fn spawn_probe(&self) -> std::io::Result<std::process::Child> {
        self.lab
            .cmd("client", &self.labnode)
            .args(["connect-many", self.vip, PORT, "1", "1", "200"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
    }

    /// After a failure at `start`: (first answer, fully restored). Fully restored is the start
    /// of the first run of `streak` consecutive new connections that all succeed and after
    /// which none failed (each connection has its own source port, so hashes to its own
    /// backend: a dead backend still in the table shows up as failures). Connections start
    /// every 20 ms, each with a 200 ms timeout, in their own process.
    pub fn restored_since(
        &self,
        start: Instant,
        limit: Duration,
        streak: usize,
    ) -> (Option<Duration>, Option<Duration>) {
        const SPACING: Duration = Duration::from_millis(20);
        const MAX_IN_FLIGHT: usize = 16;
        let mut results: Vec<(Duration, Option<bool>)> = Vec::new();
        let mut in_flight: Vec<(usize, std::process::Child)> = Vec::new();
        let mut next = Instant::now();
        let mut first = None;
        let restored = loop {
            if start.elapsed() > limit {
                break None;
            }
            if Instant::now() >= next && in_flight.len() < MAX_IN_FLIGHT {
                let child = self.spawn_probe();
                if let Ok(c) = child {
                    results.push((start.elapsed(), None));
                    in_flight.push((results.len() - 1, c));
                }
                next = Instant::now() + SPACING;
            }
            let mut k = 0;
            while k < in_flight.len() {
                if matches!(in_flight[k].1.try_wait(), Ok(Some(_))) {
                    let (idx, c) = in_flight.remove(k);
                    let ok = c
                        .wait_with_output()
                        .ok()
                        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
                        .is_some_and(|v| v["ok"] == 1);
                    if ok && first.is_none() {
                        first = Some(start.elapsed());
                    }
                    results[idx].1 = Some(ok);
                } else {
                    k += 1;
                }
            }
            // The completed prefix (in start order) decides.
            let done = results.iter().take_while(|r| r.1.is_some()).count();
            let last_fail = results[..done].iter().rposition(|r| r.1 == Some(false));
            let from = last_fail.map_or(0, |f| f + 1);
            if first.is_some() && done - from >= streak {
                break Some(results[from].0);
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        for (_, mut c) in in_flight {
            let _ = c.kill();
            let _ = c.wait();
        }
        (first, restored)
    }

    /// Time from `start` (e.g. just before a failure) until the client first gets an answer
    /// through the VIP. A new short connection (its own process, 200 ms timeout) starts every
    /// 20 ms without waiting for the previous ones, so the measurement's resolution is about
    /// 20 ms rather than a probe timeout, and one connection hashed to a dead backend does not
    /// hold up the others (each has its own source port).
    pub fn answered_since(&self, start: Instant, limit: Duration) -> Option<Duration> {
        const SPACING: Duration = Duration::from_millis(20);
        const MAX_IN_FLIGHT: usize = 12;
        let mut in_flight: Vec<std::process::Child> = Vec::new();
        let mut next = Instant::now();
        let result = loop {
            if start.elapsed() > limit {
                break None;
            }
            if Instant::now() >= next && in_flight.len() < MAX_IN_FLIGHT {
                let child = self.spawn_probe();
                if let Ok(c) = child {
                    in_flight.push(c);
                }
                next = Instant::now() + SPACING;
            }
            let mut answered = None;
            let mut i = 0;
            while i < in_flight.len() {
                if matches!(in_flight[i].try_wait(), Ok(Some(_))) {
                    let at = start.elapsed();
                    let out = in_flight.remove(i).wait_with_output();
                    let ok = out
                        .ok()
                        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
                        .is_some_and(|v| v["ok"] == 1);
                    if ok {
                        answered = Some(at);
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            if answered.is_some() {
                break answered;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        for mut c in in_flight {
            let _ = c.kill();
            let _ = c.wait();
        }
        result
    }
}

impl Drop for VrrpLab {
    fn drop(&mut self) {
        // keepalived forks its VRRP child; kill it too so nothing outlives the lab.
        for i in 0..self.nodes.len() {
            if self.opts[i].keepalived {
                self.stop(i, libc::SIGKILL);
            }
        }
    }
}
