//! `bench e2e`: the same client load against one backend directly, against the VIP served by
//! haproxy (TCP mode, OpenShift's settings) on its keepalived owner, and against the VIP served
//! by lbd (XDP, L2 DSR) on its VRRP owner; then connection survival when the VIP owner dies, for
//! keepalived+haproxy and for lbd. One lab, one run.
//!
//! The lab (network namespaces on one bridge):
//! - `client`: runs `wrk` and `labnode hold-ids`;
//! - `p1..p3`: keepalived (OpenShift's API instance: VRRPv2, advert_int 1, unicast, PASS auth)
//!   for [`VIP_HAPROXY`] and haproxy in TCP mode on every node (`balance roundrobin`,
//!   `check check-ssl verify none port 6443 inter 5s fall 3 rise 1`, `option httpchk GET
//!   /readyz HTTP/1.0`), listening on all addresses, so on the owner it serves the VIP;
//! - `l1..l3`: lbd with VRRP (defaults: VRRPv3, 100 ms adverts) for [`VIP_LBD`],
//!   `dsr_backend = false` (they are not backends), `xdp_mode = "skb"`, HTTPS `/readyz` checks;
//! - `b1..b3`: the backends, separate nodes: `standin http` on 80 (answers its id), `standin
//!   https` on 6443 (`/readyz` for both checkers), `labnode serve-id` on 8080 (echo, for
//!   long-lived connections). They hold [`VIP_LBD`] and [`VIP_FLOOR`] on lo with arp_ignore
//!   (DSR);
//! - `f1`: the floor of any L2 DSR load balancer in this lab: it holds [`VIP_FLOOR`] and runs
//!   `bench_dsr_floor` (lb-ebpf's `bench_progs.rs`: two MACs rewritten, XDP_TX, no table, no
//!   state) on its eth0, in the lbd nodes' XDP mode. The `floor` case sends every connection to
//!   `b1`: the direct case plus exactly the hop a DSR forwarder adds (the owner's receive path
//!   and the second pass through the bridge), with a program that costs nothing; `floor_3`
//!   spreads connections over the three backends by the client's port, as a load balancer
//!   does: what the lab allows a load balancer at best.
//!
//! CPU on the owner: haproxy's is its process's utime+stime; lbd's packet work is the XDP
//! program, whose run time the kernel counts with `kernel.bpf_stats_enabled` (turned on for the
//! run and restored). Both are also compared, as an upper bound that includes the extra hops,
//! through the whole machine's busy time per request against the direct case (/proc/stat).

use std::{
    collections::BTreeSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    e2e_owner,
    e2e_report::{print_table, write_report},
    median,
    throughput::BenchProgs,
    write_json,
};
use crate::{
    bin_dir,
    keepalived_haproxy::{Globals, Instance, Listen, global_defs, haproxy_cfg},
    lab::{Lab, sh, try_sh, wait_for},
};

pub const VIP_HAPROXY: &str = "10.81.0.100";
pub const VIP_LBD: &str = "10.81.0.101";
pub const VIP_FLOOR: &str = "10.81.0.102";
pub const HTTP_PORT: u16 = 80;
pub const HEALTH_PORT: u16 = 6443;
pub const ECHO_PORT: u16 = 8080;
const PROXIES: [&str; 3] = ["p1", "p2", "p3"];
const LBDS: [&str; 3] = ["l1", "l2", "l3"];
const BACKENDS: [&str; 3] = ["b1", "b2", "b3"];
const FLOOR: &str = "f1";
const PRIORITIES: [u8; 3] = [150, 100, 50];
const KEEPALIVED_VRID: u8 = 51;
const LBD_VRID: u8 = 52;
/// Length of one wrk run.
const WRK_SECS: u64 = 5;
const WRK_THREADS: u32 = 2;
const WRK_CONNS: u32 = 16;
/// Long-lived connections held through each failover.
pub(super) const HOLD_CONNS: u64 = 200;

fn addr_of(node: &str) -> String {
    let base = match &node[..1] {
        "p" => 20,
        "l" => 30,
        "b" => 10,
        "f" => 40,
        _ => panic!("node {node}"),
    };
    let i: u32 = node[1..].parse().unwrap();
    format!("10.81.0.{}", base + i)
}

pub(super) struct E2eLab {
    pub(super) lab: Lab,
    /// Native mode: the data plane whose `lb_pass` program sits on the bridge-side peers.
    _pass: Option<crate::TestDataplane>,
    /// `bench_dsr_floor` attached on the floor node (detached when dropped).
    floor: BenchProgs,
}

/// `LB_E2E_XDP_MODE`: "skb" (default, as the other labs) or "native" (driver mode on the lbd
/// nodes' veths, with an XDP_PASS program on their bridge-side peers so XDP_TX frames arrive).
fn native() -> bool {
    std::env::var("LB_E2E_XDP_MODE").is_ok_and(|v| v == "native" || v == "driver")
}

fn mac_of(lab: &Lab, node: &str) -> [u8; 6] {
    let v: Vec<u8> = lab
        .node(node)
        .mac
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

/// The floor node's forwarder: `bench_dsr_floor` on `f1`'s eth0, in the lbd nodes' XDP mode
/// (its backends set by [`E2eLab::floor_backends`]).
fn attach_floor(lab: &Lab) -> BenchProgs {
    lab.in_netns(FLOOR, || {
        let mut p = BenchProgs::load_programs(&["bench_dsr_floor"]);
        let mode = if native() {
            aya::programs::XdpMode::Driver
        } else {
            aya::programs::XdpMode::Skb
        };
        p.prog("bench_dsr_floor")
            .attach("eth0", mode)
            .expect("attach bench_dsr_floor to the floor node's eth0");
        p
    })
}

impl E2eLab {
    fn new() -> E2eLab {
        let mut lab = Lab::new("e2");
        lab.add_node("client", "10.81.0.1", "fd81::1");
        for n in PROXIES.iter().chain(&LBDS).chain(&BACKENDS).chain(&[FLOOR]) {
            let a = addr_of(n);
            let last = a.rsplit('.').next().unwrap().to_string();
            lab.add_node(n, &a, &format!("fd81::{last}"));
        }
        // Many short connections: a wide port range and TIME_WAIT reuse where connections start.
        for n in ["client"].iter().chain(&PROXIES) {
            let ns = lab.node(n).netns.clone();
            lab.sysctl(&ns, "net.ipv4.ip_local_port_range", "1024 65000");
            lab.sysctl(&ns, "net.ipv4.tcp_tw_reuse", "1");
        }
        if native() {
            // Native XDP on a veth turns a received skb into a frame and loses a pending
            // checksum offload (CHECKSUM_PARTIAL): XDP_TX would send the client's segments with
            // unfinished TCP checksums. A real NIC delivers finished checksums; the client here
            // computes them itself.
            let ns = lab.node("client").netns.clone();
            sh(&[
                "nsenter",
                &format!("--net=/run/netns/{ns}"),
                "ethtool",
                "-K",
                "eth0",
                "tx",
                "off",
            ]);
        }
        let standin = bin_dir().join("standin");
        let labnode = bin_dir().join("labnode");
        for n in BACKENDS {
            lab.make_dsr_backend(n, &[VIP_LBD, VIP_FLOOR]);
            let http = format!("0.0.0.0:{HTTP_PORT}");
            lab.spawn(
                n,
                &format!("http-{n}"),
                &standin,
                &["http", "--listen", &http, "--id", n],
            );
            let https = format!("0.0.0.0:{HEALTH_PORT}");
            lab.spawn(
                n,
                &format!("https-{n}"),
                &standin,
                &["https", "--listen", &https, "--id", n],
            );
            lab.spawn(
                n,
                &format!("echo-{n}"),
                &labnode,
                &["serve-id", &ECHO_PORT.to_string(), n],
            );
        }
        lab.add_address(FLOOR, VIP_FLOOR);
        let pass = native().then(|| {
            let peers: Vec<&str> = LBDS.iter().copied().chain([FLOOR]).collect();
            crate::attach_pass(&format!("{}-sw", lab.prefix), &peers)
        });
        let floor = attach_floor(&lab);
        let mut l = E2eLab {
            lab,
            _pass: pass,
            floor,
        };
        l.floor_backends(1);
        for (i, n) in PROXIES.iter().enumerate() {
            let hp = l.lab.dir.join(format!("haproxy-{n}.cfg"));
            std::fs::write(&hp, haproxy_config()).unwrap();
            let hp = hp.display().to_string();
            l.lab
                .spawn(n, &format!("haproxy-{n}"), "haproxy", &["-db", "-f", &hp]);
            std::fs::write(l.ka_conf(n), keepalived_config(i)).unwrap();
            l.start_keepalived(n);
        }
        for (i, n) in LBDS.iter().enumerate() {
            let cfg = l.lab.dir.join(format!("{n}.toml"));
            std::fs::write(&cfg, l.lbd_config(i)).unwrap();
            l.lab
                .cleanup(PathBuf::from("/sys/fs/bpf").join(l.pin_name(n)));
            let cfg = cfg.display().to_string();
            l.lab.spawn(
                n,
                &format!("lbd-{n}"),
                bin_dir().join("lbd"),
                &["--config", &cfg],
            );
        }
        l
    }

    /// The floor forwards [`VIP_FLOOR`] to the first `n` backends.
    fn floor_backends(&mut self, n: usize) {
        let macs: Vec<[u8; 6]> = BACKENDS[..n].iter().map(|b| mac_of(&self.lab, b)).collect();
        let own = mac_of(&self.lab, FLOOR);
        self.floor
            .set_dsr_rule(VIP_FLOOR.parse().unwrap(), &macs, own);
    }

    fn pin_name(&self, node: &str) -> String {
        format!("{}_{node}", self.lab.prefix.replace('-', "_"))
    }

    fn socket(&self, node: &str) -> String {
        self.lab
            .dir
            .join(format!("{node}.sock"))
            .display()
            .to_string()
    }

    fn ka_conf(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("ka-{node}.conf"))
    }

    fn ka_vrrp_pid(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("ka-{node}-vrrp.pid"))
    }

    fn start_keepalived(&mut self, node: &str) {
        let conf = self.ka_conf(node).display().to_string();
        let pid = self
            .lab
            .dir
            .join(format!("ka-{node}.pid"))
            .display()
            .to_string();
        let vrrp_pid = self.ka_vrrp_pid(node).display().to_string();
        // -n foreground, -P VRRP only, -l -D -G: log to the console (the lab log), no syslog.
        self.lab.spawn(
            node,
            &format!("ka-{node}"),
            "keepalived",
            &[
                "-n", "-P", "-l", "-D", "-G", "-f", &conf, "-p", &pid, "-r", &vrrp_pid,
            ],
        );
    }

    /// keepalived's VRRP child on `node`, if running (pid file, checked against its cmdline).
    fn keepalived_child(&self, node: &str) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.ka_vrrp_pid(node))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let conf = self.ka_conf(node).display().to_string();
        String::from_utf8_lossy(&cmdline)
            .contains(&conf)
            .then_some(pid)
    }

    fn kill_keepalived(&mut self, node: &str) {
        let child = self.keepalived_child(node);
        self.lab.stop(&format!("ka-{node}"), libc::SIGKILL);
        if let Some(pid) = child {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = wait_for(Duration::from_secs(5), || {
                self.keepalived_child(node).is_none().then_some(())
            });
        }
    }

    fn lbd_config(&self, i: usize) -> String {
        let me = LBDS[i];
        let mut c = format!(
            "interface = \"eth0\"\nname = \"{}\"\napi_socket = \"{}\"\nxdp_mode = \"{}\"\n\
             dsr_backend = false\n\n[[vips]]\nname = \"api\"\naddress = \"{VIP_LBD}\"\n\
             ports = [{HTTP_PORT}, {ECHO_PORT}]\nvrrp = \"api\"\n[vips.health]\nkind = \"https\"\n\
             path = \"/readyz\"\nport = {HEALTH_PORT}\n",
            self.pin_name(me),
            self.socket(me),
            if native() { "driver" } else { "skb" }
        );
        for b in BACKENDS {
            c += &format!("[[vips.backends]]\naddress = \"{}\"\n", addr_of(b));
        }
        c += &format!(
            "\n[[vrrp]]\nname = \"api\"\nvrid = {LBD_VRID}\npriority = {}\nvips = [\"{VIP_LBD}\"]\n",
            PRIORITIES[i]
        );
        c
    }

    fn lbctl(&self, node: &str, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket(node), args)
    }

    fn holds(&self, node: &str, vip: &str) -> bool {
        let ns = &self.lab.node(node).netns;
        let out = try_sh(&["ip", "-n", ns, "-j", "addr", "show", "dev", "eth0"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v[0]["addr_info"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["local"] == vip))
    }

    /// The one node of `nodes` holding `vip` on eth0, once that is so.
    fn owner(&self, nodes: &[&str], vip: &str, timeout: Duration) -> Option<String> {
        wait_for(timeout, || {
            let h: Vec<&&str> = nodes.iter().filter(|n| self.holds(n, vip)).collect();
            (h.len() == 1).then(|| h[0].to_string())
        })
    }

    /// Node failure: link down (nothing more leaves it), then its VRRP speaker is killed.
    fn fail_node(&mut self, node: &str) {
        let ns = self.lab.node(node).netns.clone();
        sh(&["ip", "-n", &ns, "link", "set", "eth0", "down"]);
        if node.starts_with('p') {
            self.kill_keepalived(node);
        } else {
            self.lab.stop(&format!("lbd-{node}"), libc::SIGKILL);
        }
    }

    /// Every lbd node sees every backend active.
    fn lbd_ready(&self) -> bool {
        LBDS.iter().all(|n| {
            self.lbctl(n, &["backends", "list"])
                .and_then(|v| v.as_array().cloned())
                .is_some_and(|rows| {
                    rows.len() == BACKENDS.len() * 2 && rows.iter().all(|r| r["state"] == "active")
                })
        })
    }

    /// Short connections through `vip` to the echo port all answered: (ok, total).
    fn probe(&self, vip: &str, count: u64) -> (u64, u64) {
        let out = self
            .lab
            .cmd("client", bin_dir().join("labnode"))
            .args([
                "connect-many",
                vip,
                &ECHO_PORT.to_string(),
                &count.to_string(),
                "4",
                "1000",
            ])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (v["ok"].as_u64().unwrap_or(0), count)
    }
}

impl Drop for E2eLab {
    fn drop(&mut self) {
        // keepalived forks its VRRP child: kill it too so nothing outlives the lab.
        for n in PROXIES {
            self.kill_keepalived(n);
        }
    }
}

fn haproxy_config() -> String {
    let listens: Vec<Listen> = [("http", HTTP_PORT), ("echo", ECHO_PORT)]
        .into_iter()
        .map(|(name, port)| Listen {
            name,
            bind: format!("*:{port}"),
            readyz_tls_port: Some(HEALTH_PORT),
            servers: BACKENDS
                .iter()
                .map(|b| (b.to_string(), format!("{}:{port}", addr_of(b))))
                .collect(),
        })
        .collect();
    haproxy_cfg("30m", &listens)
}

/// OpenShift's keepalived API instance (VRRPv2, advert_int 1, unicast peers, PASS auth).
fn keepalived_config(i: usize) -> String {
    let me = PROXIES[i];
    global_defs(&Globals {
        router_id: Some(me),
        version: Some(2),
        ..Default::default()
    }) + &Instance::openshift_v4(
        "ostest_API",
        KEEPALIVED_VRID,
        PRIORITIES[i],
        (
            addr_of(me),
            PROXIES
                .iter()
                .filter(|p| **p != me)
                .map(|p| addr_of(p))
                .collect(),
        ),
        "ostest_a",
        VIP_HAPROXY,
    )
    .render()
}

/// Whole-machine CPU from /proc/stat, in seconds: (busy, system, softirq).
fn machine_cpu() -> (f64, f64, f64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap();
    let f: Vec<f64> = s
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let hz = clk_tck();
    // user nice system idle iowait irq softirq steal
    let busy = f[0] + f[1] + f[2] + f[5] + f[6] + f.get(7).copied().unwrap_or(0.0);
    (busy / hz, f[2] / hz, f[6] / hz)
}

fn clk_tck() -> f64 {
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime+stime of a process (all threads), seconds.
pub(super) fn proc_cpu(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = s.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let t = |i: usize| {
        f.get(i - 3)
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (t(14) + t(15)) / clk_tck()
}

/// Run time of the XDP programs the given processes hold (`kernel.bpf_stats_enabled`), seconds.
fn xdp_run_time(pids: &[u32]) -> f64 {
    let mut seen = BTreeSet::new();
    let mut ns = 0u64;
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
            continue;
        };
        for e in dir.flatten() {
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_string())
            };
            // BPF_PROG_TYPE_XDP = 6
            if field("prog_type:").as_deref() != Some("6") {
                continue;
            }
            let Some(id) = field("prog_id:") else {
                continue;
            };
            if seen.insert(id) {
                ns += field("run_time_ns:")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            }
        }
    }
    ns as f64 / 1e9
}

#[derive(Clone, Debug, Default)]
pub(super) struct WrkResult {
    pub(super) rps: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) requests: u64,
    pub(super) errors: u64,
}

fn parse_duration_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1000.0)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60_000.0)
    } else {
        (s, 1.0)
    };
    num.parse::<f64>().ok().map(|v| v * mult)
}

fn parse_wrk(text: &str) -> WrkResult {
    let mut r = WrkResult::default();
    for l in text.lines() {
        let t = l.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            r.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = t.strip_prefix("50%") {
            r.p50_ms = parse_duration_ms(v).unwrap_or(0.0);
        } else if let Some(v) = t.strip_prefix("99%") {
            r.p99_ms = parse_duration_ms(v).unwrap_or(0.0);
        } else if t.contains("requests in") {
            r.requests = t
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
        } else if let Some(v) = t.strip_prefix("Socket errors:") {
            r.errors += v
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            r.errors += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    r
}

#[derive(Clone, Debug)]
pub(super) struct Run {
    pub(super) wrk: WrkResult,
    owner_cpu_s: f64,
    busy: f64,
    sys: f64,
    soft: f64,
}

fn rounds() -> usize {
    std::env::var("LB_E2E_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1)
}

pub(super) struct Case {
    pub(super) rounds: Vec<Run>,
    pub(super) name: &'static str,
    pub(super) conns: &'static str,
    pub(super) wrk: WrkResult,
    pub(super) owner_cpu_s: f64,
    machine_busy_s: f64,
    machine_softirq_s: f64,
    machine_system_s: f64,
    pub(super) extra_cpu_s: f64,
}

pub(super) fn run_wrk(l: &E2eLab, target: &str, short: bool) -> (WrkResult, (f64, f64, f64)) {
    let url = format!("http://{target}/");
    let d = format!("{WRK_SECS}s");
    let t = WRK_THREADS.to_string();
    let c = WRK_CONNS.to_string();
    let mut args = vec!["-t", &t, "-c", &c, "-d", &d, "--latency"];
    if short {
        args.extend(["-H", "Connection: close"]);
    }
    args.push(&url);
    let before = machine_cpu();
    let out = l.lab.cmd("client", "wrk").args(&args).output().unwrap();
    let after = machine_cpu();
    let text = String::from_utf8_lossy(&out.stdout);
    let r = parse_wrk(&text);
    if r.rps == 0.0 {
        eprintln!(
            "wrk against {target} gave no result:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (
        r,
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
    )
}

/// Hold [`HOLD_CONNS`] echo connections through `vip`, fail its owner among `nodes` after the
/// connections are up, count those that kept working to the end. Returns (survived, total, json).
fn survival(l: &mut E2eLab, what: &str, nodes: &[&str], vip: &str) -> (u64, u64, Value) {
    let owner = l
        .owner(nodes, vip, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{what}: no single owner of {vip}"));
    let tag = format!("hold-{what}");
    let secs = 12;
    l.lab.spawn(
        "client",
        &tag,
        bin_dir().join("labnode"),
        &[
            "hold-ids",
            vip,
            &ECHO_PORT.to_string(),
            &HOLD_CONNS.to_string(),
            &secs.to_string(),
            "200",
            // Longer than either VIP move, so a connection fails by what happens to it (a reset
            // from a proxy that has no state for it), not by the client giving up while the
            // VIP is in flight.
            "8",
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    let failed_at = Instant::now();
    l.fail_node(&owner);
    let rest: Vec<&str> = nodes.iter().copied().filter(|n| *n != owner).collect();
    let new_owner = l.owner(&rest, vip, Duration::from_secs(15));
    let moved_ms = failed_at.elapsed().as_secs_f64() * 1000.0;
    println!(
        "  {what}: failed {owner}; VIP on {} after {moved_ms:.0} ms",
        new_owner.as_deref().unwrap_or("nobody")
    );
    l.lab
        .wait(&tag, Duration::from_secs(secs + 20))
        .unwrap_or_else(|| panic!("{what}: hold-ids did not finish"));
    let log = l.lab.log(&tag);
    let v: Value = log
        .lines()
        .rev()
        .find_map(|x| serde_json::from_str(x).ok())
        .unwrap_or(Value::Null);
    let sum = |k: &str| -> u64 {
        v[k].as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0)
    };
    let survived = sum("survived_by_id");
    let failed = sum("failed_by_id");
    println!(
        "  {what}: {survived}/{} survived; errors {}",
        survived + failed,
        v["errors"]
    );
    let detail = json!({
        "failed_owner": owner,
        "new_owner": new_owner,
        "vip_moved_ms": moved_ms,
        "survived": survived,
        "failed": failed,
        "result": v,
    });
    (survived, HOLD_CONNS, detail)
}

pub fn run() {
    let started = Instant::now();
    let mut l = E2eLab::new();
    let p_owner = l
        .owner(&PROXIES, VIP_HAPROXY, Duration::from_secs(30))
        .expect("keepalived never elected an owner");
    let l_owner = l
        .owner(&LBDS, VIP_LBD, Duration::from_secs(30))
        .expect("lbd never elected an owner");
    if wait_for(Duration::from_secs(30), || l.lbd_ready().then_some(())).is_none() {
        panic!("lbd backends never all active:\n{}", l.lab.log("lbd-l1"));
    }
    // haproxy marks servers up at start (no check needed); make sure both paths answer.
    for (vip, what) in [
        (VIP_HAPROXY, "haproxy"),
        (VIP_LBD, "lbd"),
        (VIP_FLOOR, "floor"),
    ] {
        let ok = wait_for(Duration::from_secs(15), || {
            let (ok, n) = l.probe(vip, 12);
            (ok == n).then_some(())
        });
        if ok.is_none() {
            let sw = format!("{}-sw", l.lab.prefix);
            let link = try_sh(&["ip", "-n", &sw, "-d", "link", "show", "l1"]);
            panic!(
                "{what}: VIP {vip} does not answer\nswitch side l1: {}\nl1 stats: {:?}",
                String::from_utf8_lossy(&link.stdout),
                l.lbctl("l1", &["stats"])
            );
        }
    }
    println!(
        "lab up in {:.0} s: haproxy owner {p_owner}, lbd owner {l_owner}",
        started.elapsed().as_secs_f64()
    );
    let haproxy_pid = l
        .lab
        .pid(&format!("haproxy-{p_owner}"))
        .expect("haproxy running");
    let lbd_pids: Vec<u32> = LBDS
        .iter()
        .filter_map(|n| l.lab.pid(&format!("lbd-{n}")))
        .collect();
    let stats_before = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .unwrap_or_else(|_| "0".into());
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").unwrap();

    let direct = format!("{}:{HTTP_PORT}", addr_of("b1"));
    let via_haproxy = format!("{VIP_HAPROXY}:{HTTP_PORT}");
    let via_lbd = format!("{VIP_LBD}:{HTTP_PORT}");
    let via_floor = format!("{VIP_FLOOR}:{HTTP_PORT}");
    let rounds = rounds();
    let mut cases = Vec::new();
    for (conns, short) in [("short", true), ("long", false)] {
        let names = ["direct", "floor", "floor_3", "haproxy", "lbd"];
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); names.len()];
        // Rounds interleave the cases, so drift in the machine's other load hits all alike.
        for round in 0..rounds {
            for (i, (name, target)) in names
                .iter()
                .zip([&direct, &via_floor, &via_floor, &via_haproxy, &via_lbd])
                .enumerate()
            {
                match *name {
                    "floor" => l.floor_backends(1),
                    "floor_3" => l.floor_backends(BACKENDS.len()),
                    _ => {}
                }
                let hp0 = proc_cpu(haproxy_pid);
                let x0 = xdp_run_time(&lbd_pids);
                let (wrk, (busy, sys, soft)) = run_wrk(&l, target, short);
                let owner_cpu_s = match *name {
                    "haproxy" => proc_cpu(haproxy_pid) - hp0,
                    "lbd" => xdp_run_time(&lbd_pids) - x0,
                    _ => 0.0,
                };
                println!(
                    "  round {} {name:<8} {conns:<5} {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  \
                     owner CPU {owner_cpu_s:.3} s  errors {}",
                    round + 1,
                    wrk.rps,
                    wrk.p50_ms,
                    wrk.p99_ms,
                    wrk.errors
                );
                runs[i].push(Run {
                    wrk,
                    owner_cpu_s,
                    busy,
                    sys,
                    soft,
                });
            }
        }
        for (name, runs) in names.iter().zip(runs) {
            let med = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
            let sum = |f: fn(&Run) -> f64| runs.iter().map(f).sum::<f64>();
            cases.push(Case {
                name,
                conns,
                wrk: WrkResult {
                    rps: med(|r| r.wrk.rps),
                    p50_ms: med(|r| r.wrk.p50_ms),
                    p99_ms: med(|r| r.wrk.p99_ms),
                    requests: runs.iter().map(|r| r.wrk.requests).sum(),
                    errors: runs.iter().map(|r| r.wrk.errors).sum(),
                },
                owner_cpu_s: sum(|r| r.owner_cpu_s),
                machine_busy_s: sum(|r| r.busy),
                machine_softirq_s: sum(|r| r.soft),
                machine_system_s: sum(|r| r.sys),
                extra_cpu_s: 0.0,
                rounds: runs,
            });
        }
    }
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_before.trim());
    // Extra machine CPU of a case against the direct case at the same request count.
    for conns in ["short", "long"] {
        let per_req = |c: &Case| c.machine_busy_s / (c.wrk.requests.max(1) as f64);
        let base = cases
            .iter()
            .find(|c| c.name == "direct" && c.conns == conns)
            .map(per_req)
            .unwrap_or(0.0);
        for c in cases.iter_mut().filter(|c| c.conns == conns) {
            c.extra_cpu_s = (per_req(c) - base) * c.wrk.requests as f64;
        }
    }

    let lbd_owner_pid = l
        .lab
        .pid(&format!("lbd-{l_owner}"))
        .expect("lbd running on the owner");
    println!("owner CPU, like for like (the owner's processes + its receive path's NAPI thread):");
    let owner_cpu = e2e_owner::like_for_like(
        &l,
        [
            ("haproxy", &p_owner, &via_haproxy, haproxy_pid),
            ("lbd", &l_owner, &via_lbd, lbd_owner_pid),
        ],
    );
    // Where the time goes, short connections: a CPU profile of the whole machine per case.
    let mut profiles = Vec::new();
    if std::env::var_os("LB_E2E_PROFILE").is_some() {
        for (name, target) in [
            ("direct", &direct),
            ("lbd", &via_lbd),
            ("haproxy", &via_haproxy),
        ] {
            let path = e2e_owner::profile(&format!("{name}-short"), &super::out_dir(), || {
                run_wrk(&l, target, true);
            });
            match path {
                Some(p) => {
                    println!("  profile of {name} (short): {}", p.display());
                    profiles.push(p.display().to_string());
                }
                None => println!("  no profile of {name}: perf missing or unable to sample"),
            }
        }
    }

    println!("survival of {HOLD_CONNS} long-lived connections when the VIP owner dies:");
    let (hs, ht, hdetail) = survival(&mut l, "haproxy", &PROXIES, VIP_HAPROXY);
    let (ls, lt, ldetail) = survival(&mut l, "lbd", &LBDS, VIP_LBD);
    let haproxy_pct = 100.0 * hs as f64 / ht as f64;
    let lbd_pct = 100.0 * ls as f64 / lt as f64;
    drop(l);

    print_table(&cases, haproxy_pct, lbd_pct);
    let doc = json!({
        "cases": cases.iter().map(|c| json!({
            "name": c.name,
            "connections": c.conns,
            "rps": c.wrk.rps,
            "p50_ms": c.wrk.p50_ms,
            "p99_ms": c.wrk.p99_ms,
            "owner_cpu_s": c.owner_cpu_s,
            "requests": c.wrk.requests,
            "load_s": c.rounds.len() as u64 * WRK_SECS,
            "owner_cpu_us_per_req": 1e6 * c.owner_cpu_s / c.wrk.requests.max(1) as f64,
            "extra_machine_cpu_us_per_req": 1e6 * c.extra_cpu_s / c.wrk.requests.max(1) as f64,
            "rounds": c.rounds.iter().map(|r| json!({
                "rps": r.wrk.rps, "p50_ms": r.wrk.p50_ms, "p99_ms": r.wrk.p99_ms,
                "requests": r.wrk.requests, "errors": r.wrk.errors, "owner_cpu_s": r.owner_cpu_s,
                "machine_busy_s": r.busy,
            })).collect::<Vec<_>>(),
            "errors": c.wrk.errors,
            "machine_busy_s": c.machine_busy_s,
            "machine_system_s": c.machine_system_s,
            "machine_softirq_s": c.machine_softirq_s,
            "extra_machine_cpu_vs_direct_s": c.extra_cpu_s,
        })).collect::<Vec<_>>(),
        "owner_cpu_like_for_like": owner_cpu,
        "profiles": profiles,
        "survival": {
            "haproxy_pct": haproxy_pct,
            "lbd_pct": lbd_pct,
            "connections": HOLD_CONNS,
            "haproxy": hdetail,
            "lbd": ldetail,
        },
        "method": {
            "load": format!("wrk -t{WRK_THREADS} -c{WRK_CONNS} -d{WRK_SECS}s --latency [-H 'Connection: close'] http://TARGET/ from the client namespace; backends: standin http; {rounds} rounds interleaving the cases; rps/p50/p99 are medians of the rounds, CPU and requests are totals over the rounds"),
            "owner_cpu_s": "haproxy: utime+stime of the owner's haproxy process; lbd: run time of the XDP programs (kernel.bpf_stats_enabled); direct: 0 (not like for like: see owner_cpu_like_for_like)",
            "owner_cpu_like_for_like": "one more wrk run per case after the rounds, with the owner's eth0 and its bridge-side peer in threaded NAPI (GRO on): the owner's load-balancer process (haproxy, or lbd) utime+stime + the CPU time of the owner's eth0 NAPI thread (its whole receive path: TCP/IP for haproxy; skb handling, XDP and XDP_TX for lbd), per request",
            "extra_machine_cpu_vs_direct_s": "(busy CPU per request of the case - of the direct case) x requests of the case; busy = user+nice+system+irq+softirq+steal of /proc/stat, whole machine (other work on the machine is included)",
            "xdp_mode": if native() { "driver (native; lb_pass on the bridge-side veth peers)" } else { "skb (generic)" },
            "survival": "labnode hold-ids: 200 echo connections, a line every 200 ms for 12 s, reads may wait 8 s; the owner's link goes down and its keepalived/lbd is killed (SIGKILL) 3 s in",
        },
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    write_json("e2e", &doc);
    write_report(&cases, haproxy_pct, lbd_pct, &doc);
    println!("total {:.0} s", started.elapsed().as_secs_f64());
}
