//! `bench migrate`: the move from keepalived + haproxy to lb rehearsed on three control-plane
//! nodes under load, node by node with the steps docs/openshift.md gives, then one node back.
//!
//! The lab starts as OpenShift runs the API VIP today: on every node keepalived (VRRPv2,
//! `advert_int 1`, PASS auth, unicast peers, priority 40 plus a tracked script worth +28 that
//! passes: OpenShift's haproxy +20, apiserver +5, machine-config server +3), an apiserver
//! stand-in (`standin https` on 6443: `/readyz` over TLS) beside the echo service that carries
//! the traffic, and haproxy in TCP mode on 9445 balancing over every node with `GET /readyz`
//! checks over TLS (`check-ssl verify none`, [`crate::openshift::haproxy_api_cfg`]), reached
//! through haproxy-monitor's nftables table `ocp_nat`: VIP:PORT redirected to 9445 in
//! PREROUTING and in OUTPUT, so the node's own connections go through haproxy too
//! ([`crate::openshift::ocp_nat_rules`]; checked: the holder's own connections reach several
//! nodes). Every node is a DSR backend (the VIP on lo, ARP sysctls) once it runs lbd, as lb's
//! rendered config makes it.
//!
//! Steps (each one measured under the same load):
//! - `reference: keepalived master restart`: keepalived + haproxy's own failover (the master
//!   stops gracefully and comes back), what the migration is compared with;
//! - `<node> -> lb` for every node, backups first and the VIP's holder last: stop haproxy and
//!   keepalived (SIGTERM: a master sends priority 0), remove the redirect table, start lbd with
//!   the migration profile `lbctl render` writes with `vrrp_version = 2` (VRRPv3 that also
//!   speaks VRRPv2 with the PASS password, 1 s adverts, the same +28 as its tracked checks);
//! - `switch to VRRPv3`: every node's config rewritten with the final profile (plain v3,
//!   100 ms adverts), which lbd picks up by itself (config file watch) and applies in place;
//! - `migration profile again`: the same back, before a node may return to keepalived;
//! - `<node> -> keepalived`: a backup stops lbd and runs keepalived + haproxy again.
//!
//! The load is the chaos lab's ([`crate::chaos::load`]), from a client beside the nodes for
//! the whole rehearsal: [`LONG_LIVED`] long-lived connections echoing a line every 100 ms (a
//! lost one is replaced) and new connections at a fixed rate, each given 3 s. Per step: time
//! with two holders of the VIP (eth0 sampled every 20 ms), new connections attempted and
//! failed, long-lived connections lost, VIP moves (changes of the single holder).

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use lb_userspace::{
    config::XdpMode,
    render::{ClusterSpec, to_toml},
};
use serde::Serialize;
use serde_json::json;

use crate::{
    chaos::load::{Load, Proto, Target},
    lab::{has_address, sh, try_sh, wait_for},
    openshift::{APISERVER_PORT, Checks, haproxy_api_cfg, keepalived_conf, ocp_nat_rules},
    vrrp_lab::{NodeOpts, OPENSHIFT_PASS, PORT, VrrpLab},
};

/// One step's measurements (the schema of target/bench/migrate.json).
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub step: String,
    pub dual_master_ms: f64,
    pub new_failed: u64,
    pub new_attempted: u64,
    pub long_lived_lost: u64,
    pub vip_moves: u64,
    /// The same for the workers' ingress VIP.
    pub ingress_dual_master_ms: f64,
    pub ingress_vip_moves: u64,
}

/// OpenShift's tracked scripts on a healthy node: haproxy +20, apiserver +5, MCS +3.
const TRACKED: i32 = 28;
const SAMPLE: Duration = Duration::from_millis(20);
pub const LONG_LIVED: usize = 16;

/// keepalived as OpenShift runs it; haproxy and its redirect are this module's
/// ([`start_haproxy`]).
fn keepalived_opts() -> NodeOpts {
    NodeOpts {
        track_weight: Some(TRACKED),
        ..NodeOpts::openshift_keepalived(40)
    }
}

fn in_netns(l: &VrrpLab, i: usize, args: &[&str]) -> std::process::Output {
    let netns = format!("--net=/run/netns/{}", l.lab.node(&l.nodes[i]).netns);
    let mut a = vec!["nsenter", netns.as_str()];
    a.extend_from_slice(args);
    try_sh(&a)
}

fn haproxy_tag(l: &VrrpLab, i: usize) -> String {
    format!("ocp-haproxy-{}", l.nodes[i])
}

/// What OpenShift runs beside keepalived on node `i`: haproxy over every node, and the
/// `ocp_nat` redirect to it.
fn start_haproxy(l: &mut VrrpLab, i: usize) {
    let n = l.nodes[i].clone();
    let port: u16 = PORT.parse().unwrap();
    let servers: Vec<(String, u16)> = l.nodes.iter().map(|m| (l.addr(m), port)).collect();
    let cfg = l.lab.dir.join(format!("ocp-haproxy-{n}.cfg"));
    std::fs::write(&cfg, haproxy_api_cfg(&servers)).unwrap();
    let rules = l.lab.dir.join(format!("ocp-nat-{n}.nft"));
    let vip: IpAddr = l.vip.parse().unwrap();
    std::fs::write(&rules, ocp_nat_rules(vip, port)).unwrap();
    remove_redirect(l, i);
    let netns = format!("--net=/run/netns/{}", l.lab.node(&n).netns);
    sh(&["nsenter", &netns, "nft", "-f", &rules.display().to_string()]);
    let tag = haproxy_tag(l, i);
    l.lab.spawn(
        &n,
        &tag,
        "haproxy",
        &["-db", "-f", &cfg.display().to_string()],
    );
}

/// Node `i`'s keepalived and haproxy stopped with `signal` (keepalived first: a master resigns
/// while haproxy still serves).
fn stop_openshift(l: &mut VrrpLab, i: usize, signal: i32) {
    l.stop(i, signal);
    let tag = haproxy_tag(l, i);
    l.lab.stop(&tag, signal);
}

/// Ids of the nodes that answered connections to the VIP opened on node `i` itself (a host's
/// own traffic) for `secs`.
fn host_traffic_ids(l: &VrrpLab, i: usize, secs: u64) -> BTreeSet<String> {
    let vip: IpAddr = l.vip.parse().unwrap();
    let target = Target {
        addr: SocketAddr::new(vip, PORT.parse().unwrap()),
        proto: Proto::Echo,
    };
    let netns = l.lab.node(&l.nodes[i]).netns.clone();
    let probe = Load::start(&netns, Vec::new(), 0, vec![target], 20);
    std::thread::sleep(Duration::from_secs(secs));
    let ids = probe
        .shorts(0, u64::MAX)
        .into_iter()
        .filter_map(|s| s.result.ok())
        .collect();
    probe.stop();
    ids
}

/// lbd as `lbctl render` writes it: the migration profile (`vrrp_version = 2`) or the final one.
fn lbd_opts(migrating: bool) -> NodeOpts {
    NodeOpts {
        priority: 40,
        version: 3,
        v2_compat: migrating,
        advert_ms: if migrating { 1000 } else { 100 },
        auth_pass: migrating.then(|| OPENSHIFT_PASS.to_string()),
        unicast: true,
        ..Default::default()
    }
}

/// Node `i`'s lbd config, with lbd's own readiness tracked for what OpenShift's checks add up
/// to (the same effective priority as a healthy keepalived node).
/// Its backends are checked as `lbctl render` checks the apiservers: `/readyz` over TLS on
/// the apiserver's port.
fn write_lbd_config(l: &VrrpLab, i: usize) {
    let track =
        format!("\n[[track]]\ninstance = \"api\"\nname = \"chk_ocp\"\nweight = {TRACKED}\n");
    let config = l.config(i).replacen(
        "[vips.health]\nkind = \"tcp\"\n",
        &format!("[vips.health]\nkind = \"https\"\npath = \"/readyz\"\nport = {APISERVER_PORT}\n"),
        1,
    );
    assert!(config.contains("kind = \"https\""), "{config}");
    std::fs::write(l.config_path(i), config + &track).unwrap();
}

/// Who holds a VIP on eth0, sampled beside the steps.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<usize>>>,
}

impl Sampler {
    /// Holders of `vip` among the nodes of `netns`.
    fn start(netns: Vec<String>, vip: String) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !s.load(Ordering::Relaxed) {
                out.push(
                    netns
                        .iter()
                        .enumerate()
                        .filter(|(_, ns)| has_address(ns, "eth0", &vip))
                        .map(|(i, _)| i)
                        .collect(),
                );
                std::thread::sleep(SAMPLE);
            }
            out
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Vec<Vec<usize>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// (dual-master ms, VIP moves) of a series of holder samples.
pub fn summarize(samples: &[Vec<usize>]) -> (f64, u64) {
    let dual = samples.iter().filter(|h| h.len() > 1).count();
    let mut moves = 0;
    let mut last: Option<usize> = None;
    for h in samples.iter().filter(|h| h.len() == 1) {
        if last.is_some_and(|l| l != h[0]) {
            moves += 1;
        }
        last = Some(h[0]);
    }
    (dual as f64 * SAMPLE.as_secs_f64() * 1000.0, moves)
}

/// Run `action` under `load` for `secs` seconds and measure it.
fn measure(
    l: &mut VrrpLab,
    w: &mut Workers,
    load: &Load,
    name: &str,
    secs: u64,
    action: impl FnOnce(&mut VrrpLab, &mut Workers),
) -> Step {
    // Every step starts with the full set of long-lived connections.
    let _ = wait_for(Duration::from_secs(15), || {
        (load.long_up() == LONG_LIVED).then_some(())
    });
    let api: Vec<String> = l
        .nodes
        .iter()
        .map(|n| l.lab.node(n).netns.clone())
        .collect();
    let sampler = Sampler::start(api, l.vip.to_string());
    let ingress: Vec<String> = w
        .names
        .iter()
        .map(|n| l.lab.node(n).netns.clone())
        .collect();
    let ingress = Sampler::start(ingress, INGRESS_VIP.to_string());
    let from = load.now_ms();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    action(l, w);
    if let Some(rest) = Duration::from_secs(secs).checked_sub(start.elapsed()) {
        std::thread::sleep(rest);
    }
    let to = load.now_ms();
    let (dual_master_ms, vip_moves) = summarize(&sampler.finish());
    let (ingress_dual_master_ms, ingress_vip_moves) = summarize(&ingress.finish());
    let shorts = load.shorts(from, to);
    let step = Step {
        step: name.to_string(),
        dual_master_ms,
        new_failed: shorts.iter().filter(|s| s.result.is_err()).count() as u64,
        new_attempted: shorts.len() as u64,
        long_lived_lost: load.lost(from, to).len() as u64,
        vip_moves,
        ingress_dual_master_ms,
        ingress_vip_moves,
    };
    println!(
        "{:<36} {:>8.0} {:>6}/{:<6} {:>5} {:>5} {:>8.0} {:>5}",
        step.step,
        step.dual_master_ms,
        step.new_failed,
        step.new_attempted,
        step.long_lived_lost,
        step.vip_moves,
        step.ingress_dual_master_ms,
        step.ingress_vip_moves
    );
    step
}

/// The node holding the VIP (waiting for exactly one).
fn holder(l: &VrrpLab) -> usize {
    let all: Vec<usize> = (0..l.nodes.len()).collect();
    wait_for(Duration::from_secs(20), || match l.holders(&all)[..] {
        [h] => Some(h),
        _ => None,
    })
    .unwrap_or_else(|| panic!("no single VIP holder\n{}", l.logs()))
}

/// haproxy-monitor's table gone from node `i` (`nft delete table ip ocp_nat`).
fn remove_redirect(l: &VrrpLab, i: usize) {
    let family = if l.vip.contains(':') { "ip6" } else { "ip" };
    let _ = in_netns(l, i, &["nft", "delete", "table", family, "ocp_nat"]);
}

/// Node `i` from keepalived + haproxy to lbd (the migration profile): the documented order.
fn to_lbd(l: &mut VrrpLab, i: usize) {
    // The node is a DSR backend before its keepalived stops: the VIP on lo (ARP sysctls) as
    // lbd would put it, so an lbd owner's flows to it are served from the first moment.
    let n = l.nodes[i].clone();
    l.lab.make_dsr_backend(&n, &[l.vip]);
    stop_openshift(l, i, libc::SIGTERM);
    remove_redirect(l, i);
    l.opts[i] = lbd_opts(true);
    write_lbd_config(l, i);
    l.start(i);
    wait_for(Duration::from_secs(20), || {
        matches!(l.state(i).as_deref(), Some("backup" | "master")).then_some(())
    })
    .unwrap_or_else(|| panic!("lbd on {} joins\n{}", l.nodes[i], l.logs()));
}

/// Every lbd node's config rewritten to `migrating`'s profile, backups first; lbd reloads on
/// its own (config file watch). Waits until each applied it.
fn reprofile(l: &mut VrrpLab, migrating: bool) {
    let h = holder(l);
    let mut order: Vec<usize> = (0..l.nodes.len()).filter(|i| *i != h).collect();
    order.push(h);
    for i in order {
        if l.opts[i].keepalived {
            continue;
        }
        l.opts[i] = lbd_opts(migrating);
        write_lbd_config(l, i);
        let want = u64::from(l.opts[i].advert_ms);
        wait_for(Duration::from_secs(15), || {
            (l.status(i)?["advert_interval_ms"].as_u64()? == want).then_some(())
        })
        .unwrap_or_else(|| panic!("{} reloads its new config\n{}", l.nodes[i], l.logs()));
    }
}

/// Node `i` from lbd back to keepalived + haproxy (the cluster on the migration profile).
fn to_keepalived(l: &mut VrrpLab, i: usize) {
    l.stop(i, libc::SIGTERM);
    // lb's rollback: remove what lbd added (XDP program, pins, VIPs, sysctls), then keep the
    // node a DSR backend of the lbd owners, as the keepalived nodes were.
    let out = l.lbd(i, &["teardown"]);
    assert!(
        out.status.success(),
        "teardown: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = l.nodes[i].clone();
    // The VIP stayed on lo (put there before lbd, `lbd teardown` leaves what it did not add).
    let on_lo = has_address(&l.lab.node(&n).netns, "lo", l.vip);
    let vips = [l.vip];
    l.lab.make_dsr_backend(&n, if on_lo { &[] } else { &vips });
    l.opts[i] = keepalived_opts();
    l.write_keepalived_config(i);
    start_haproxy(l, i);
    l.start(i);
    wait_for(Duration::from_secs(20), || {
        matches!(l.state(i).as_deref(), Some("backup" | "master")).then_some(())
    })
    .unwrap_or_else(|| panic!("keepalived on {} joins\n{}", l.nodes[i], l.logs()));
}

/// New connections per second of the load.
const SHORT_RATE: u32 = 100;

/// The whole rehearsal; `secs` of load per step. Returns (steps, reference).
pub fn rehearse(labnode: &str, secs: u64) -> (Vec<Step>, Vec<Step>) {
    // As on OpenShift: keepalived nodes do not hold the VIP on lo (they are no DSR backends).
    let mut l = VrrpLab::prepare(labnode, vec![keepalived_opts(); 3]);
    let standin = crate::bin_dir().join("standin");
    let listen = format!("0.0.0.0:{APISERVER_PORT}");
    for i in 0..3 {
        let n = l.nodes[i].clone();
        l.lab.spawn(
            &n,
            &format!("apiserver-{n}"),
            &standin,
            &["https", "--listen", &listen, "--id", &n],
        );
        start_haproxy(&mut l, i);
        l.start(i);
    }
    let h = holder(&l);
    assert!(l.wait_serving(Duration::from_secs(20)), "{}", l.logs());
    // The holder's own connections to the VIP go through its haproxy (ocp_nat's OUTPUT
    // chain), which balances them over the nodes; without it they would all stay local.
    let ids = host_traffic_ids(&l, h, 2);
    assert!(
        ids.len() > 1,
        "{}'s own connections to the VIP reached only {ids:?}\n{}",
        l.nodes[h],
        l.logs()
    );
    let vip: IpAddr = l.vip.parse().unwrap();
    let target = Target {
        addr: SocketAddr::new(vip, PORT.parse().unwrap()),
        proto: Proto::Echo,
    };
    let mut w = Workers::add(&mut l, labnode);
    let ingress = Target {
        addr: SocketAddr::new(INGRESS_VIP.parse().unwrap(), INGRESS_PORT),
        proto: Proto::Echo,
    };
    let targets = vec![target, ingress];
    let client = l.lab.node("client").netns.clone();
    let load = Load::start(&client, targets.clone(), LONG_LIVED, targets, SHORT_RATE);
    println!(
        "{:<36} {:>8} {:>13} {:>5} {:>5} {:>8} {:>5}",
        "STEP", "DUAL_MS", "NEW_FAILED", "LOST", "MOVES", "ING_DUAL", "MOVES"
    );
    let mut reference = Vec::new();
    reference.push(measure(
        &mut l,
        &mut w,
        &load,
        "reference: keepalived master restart",
        secs,
        |l, w| {
            let h = holder(l);
            stop_openshift(l, h, libc::SIGTERM);
            let k = w.holder(l);
            w.stop_keepalived(l, k);
            holder(l);
            start_haproxy(l, h);
            l.start(h);
            w.holder(l);
            w.start_keepalived(l, k);
        },
    ));
    let mut steps = Vec::new();
    let h = holder(&l);
    let mut order: Vec<usize> = (0..3).filter(|i| *i != h).collect();
    order.push(h);
    for i in order {
        let name = format!("{} -> lb", l.nodes[i]);
        steps.push(measure(&mut l, &mut w, &load, &name, secs, |l, _| {
            to_lbd(l, i)
        }));
    }
    // The workers' ingress VIP the same way: the backup first, the holder last.
    let h = w.holder(&l);
    for k in [1 - h, h] {
        let name = format!("{} -> lb", w.names[k]);
        steps.push(measure(&mut l, &mut w, &load, &name, secs, |l, w| {
            w.move_to_lbd(l, k)
        }));
    }
    steps.push(measure(
        &mut l,
        &mut w,
        &load,
        "switch to VRRPv3 (reload)",
        secs,
        |l, w| {
            reprofile(l, false);
            w.reprofile(l, false);
        },
    ));
    steps.push(measure(
        &mut l,
        &mut w,
        &load,
        "migration profile again (reload)",
        secs,
        |l, w| {
            reprofile(l, true);
            w.reprofile(l, true);
        },
    ));
    let h = holder(&l);
    let back = (0..3).find(|i| *i != h).unwrap();
    let name = format!("{} -> keepalived", l.nodes[back]);
    steps.push(measure(&mut l, &mut w, &load, &name, secs, |l, _| {
        to_keepalived(l, back)
    }));
    load.stop();
    w.stop_keepalived_all(&mut l);
    // Who changed state when, for reading a run (the table says how much, this says why).
    for (i, n) in l.nodes.iter().enumerate() {
        for line in l
            .log(i)
            .lines()
            .filter(|t| t.contains("VRRP state change") || t.contains("Entering"))
        {
            println!("{n}: {line}");
        }
    }
    for n in &w.names {
        let log = l.lab.log(&format!("ka-{n}")) + &l.lab.log(&format!("lbd-{n}"));
        for line in log
            .lines()
            .filter(|t| t.contains("VRRP state change") || t.contains("Entering"))
        {
            println!("{n}: {line}");
        }
    }
    (steps, reference)
}

/// The workers' ingress VIP and the port of the traffic their routers carry (an echo
/// service; the routers' health endpoints are a stand-in on [`ROUTER_STATS_PORT`]).
pub const INGRESS_VIP: &str = "10.78.0.101";
const INGRESS_PORT: u16 = 8081;
const ROUTER_STATS_PORT: u16 = 1936;
/// Where the workers are in [`worker_spec`]'s nodes.
const FIRST_WORKER: usize = 3;
const WORKERS: [(&str, &str, &str); 2] = [
    ("w1", "10.78.0.21", "fd78::21"),
    ("w2", "10.78.0.22", "fd78::22"),
];

/// The workers as a cluster description: what `lbctl render` and OpenShift's keepalived.conf
/// ([`crate::openshift::keepalived_conf`]) are made from.
pub fn worker_spec(migrating: bool) -> ClusterSpec {
    let mut text = format!(
        "name = \"ostest\"\ninterface = \"eth0\"\napi_vip = \"{}\"\ningress_vip = \"{INGRESS_VIP}\"\ningress_ports = [{INGRESS_PORT}]\nvrrp_version = {}\n",
        crate::vrrp_lab::VIP4,
        if migrating { 2 } else { 3 }
    );
    // The control-plane nodes (the lab's n1..n3, whose API VIP is the lab's own) are peers of
    // the ingress instance too, as every node is on OpenShift; they run no router.
    for i in 0..3 {
        text += &format!(
            "[[nodes]]\nname = \"n{}\"\naddress = \"10.78.0.{}\"\nroles = [\"control-plane\"]\n",
            i + 1,
            11 + i
        );
    }
    for (name, v4, _) in WORKERS {
        text +=
            &format!("[[nodes]]\nname = \"{name}\"\naddress = \"{v4}\"\nroles = [\"worker\"]\n");
    }
    ClusterSpec::parse(&text).expect("the workers' cluster description")
}

/// The two workers: a router (its health endpoints and an echo service) on each, and
/// keepalived for the ingress VIP as OpenShift runs it, until they move to lbd.
struct Workers {
    names: Vec<String>,
    /// Which run lbd (else keepalived).
    lbd: Vec<bool>,
}

impl Workers {
    fn add(l: &mut VrrpLab, labnode: &str) -> Workers {
        let standin = crate::bin_dir().join("standin");
        let spec = worker_spec(true);
        let curl = |path: &str| {
            format!("/usr/bin/curl -sf -m 1 http://127.0.0.1:{ROUTER_STATS_PORT}{path}")
        };
        let checks = Checks {
            ocp_lb: "/bin/true".into(),
            ocp_both: "/bin/true".into(),
            mcs: "/bin/true".into(),
            ingress: curl("/healthz"),
            ingress_ready: curl("/healthz/ready"),
            default_ingress: curl("/healthz/ready"),
        };
        let mut w = Workers {
            names: Vec::new(),
            lbd: Vec::new(),
        };
        for (k, (name, v4, v6)) in WORKERS.iter().enumerate() {
            l.lab.add_node(name, v4, v6);
            let stats = format!("0.0.0.0:{ROUTER_STATS_PORT}");
            l.lab.spawn(
                name,
                &format!("router-{name}"),
                &standin,
                &["http", "--listen", &stats, "--id", name],
            );
            l.lab.spawn(
                name,
                &format!("ingress-{name}"),
                labnode,
                &["serve-id", &INGRESS_PORT.to_string(), name],
            );
            let conf = keepalived_conf(&spec, &spec.nodes[FIRST_WORKER + k], &checks);
            std::fs::write(w.path(l, k, "conf"), conf).unwrap();
            w.names.push(name.to_string());
            w.lbd.push(false);
            w.start_keepalived(l, k);
        }
        w.holder(l);
        w
    }

    fn path(&self, l: &VrrpLab, k: usize, ext: &str) -> PathBuf {
        l.lab.dir.join(format!("{}.{ext}", WORKERS[k].0))
    }

    fn start_keepalived(&self, l: &mut VrrpLab, k: usize) {
        let p = |e| self.path(l, k, e).display().to_string();
        let (conf, pid, vrrp_pid) = (p("conf"), p("pid"), p("vrrp-pid"));
        let name = &self.names[k];
        l.lab.spawn(
            name,
            &format!("ka-{name}"),
            "keepalived",
            &[
                "-n", "-P", "-l", "-D", "-G", "-f", &conf, "-p", &pid, "-r", &vrrp_pid,
            ],
        );
    }

    /// keepalived's VRRP child of worker `k`, if running (from its pid file, checked).
    fn keepalived_child(&self, l: &VrrpLab, k: usize) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.path(l, k, "vrrp-pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let conf = self.path(l, k, "conf").display().to_string();
        String::from_utf8_lossy(&cmdline)
            .contains(&conf)
            .then_some(pid)
    }

    /// SIGTERM (a master resigns with priority 0), and its VRRP child gone.
    fn stop_keepalived(&self, l: &mut VrrpLab, k: usize) {
        let child = self.keepalived_child(l, k);
        l.lab.stop(&format!("ka-{}", self.names[k]), libc::SIGTERM);
        if let Some(pid) = child
            && wait_for(Duration::from_secs(5), || {
                self.keepalived_child(l, k).is_none().then_some(())
            })
            .is_none()
        {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    fn stop_keepalived_all(&self, l: &mut VrrpLab) {
        for k in 0..self.names.len() {
            if !self.lbd[k] {
                self.stop_keepalived(l, k);
            }
        }
    }

    /// The worker holding the ingress VIP (waiting for exactly one).
    fn holder(&self, l: &VrrpLab) -> usize {
        wait_for(Duration::from_secs(20), || {
            let held: Vec<usize> = (0..self.names.len())
                .filter(|k| has_address(&l.lab.node(&self.names[*k]).netns, "eth0", INGRESS_VIP))
                .collect();
            match held[..] {
                [k] => Some(k),
                _ => None,
            }
        })
        .unwrap_or_else(|| {
            panic!(
                "no single ingress VIP holder\n{}",
                self.names
                    .iter()
                    .map(|n| l.lab.log(&format!("ka-{n}")) + &l.lab.log(&format!("lbd-{n}")))
                    .collect::<String>()
            )
        })
    }

    fn socket(&self, l: &VrrpLab, k: usize) -> String {
        self.path(l, k, "sock").display().to_string()
    }

    /// Worker `k`'s config as `lbctl render` writes it, with the lab's socket, pin name and
    /// XDP mode.
    fn write_lbd_config(&self, l: &VrrpLab, k: usize, migrating: bool) {
        let mut r = worker_spec(migrating)
            .render()
            .expect("render the workers")
            .remove(FIRST_WORKER + k);
        r.config.api_socket = self.socket(l, k).into();
        r.config.name = self.pin_name(l, k);
        r.config.xdp_mode = XdpMode::Skb;
        // The rehearsal is of the election and the procedure; the cluster key (sync and
        // membership, on by default) is not part of it.
        r.config.sync = None;
        r.config.members = None;
        std::fs::write(self.path(l, k, "toml"), to_toml("ostest", &r)).unwrap();
    }

    fn pin_name(&self, l: &VrrpLab, k: usize) -> String {
        format!("{}_{}", l.lab.prefix.replace('-', "_"), self.names[k])
    }

    /// The ingress instance's `lbctl vrrp status`.
    fn status(&self, l: &VrrpLab, k: usize) -> Option<serde_json::Value> {
        let v = crate::lbctl_json(&self.socket(l, k), &["vrrp", "status"])?;
        Some(v[0].clone())
    }

    /// Worker `k` from keepalived to lbd (the migration profile), as the API nodes move.
    fn move_to_lbd(&mut self, l: &mut VrrpLab, k: usize) {
        l.lab.make_dsr_backend(&self.names[k], &[INGRESS_VIP]);
        self.stop_keepalived(l, k);
        self.write_lbd_config(l, k, true);
        let name = self.names[k].clone();
        l.lab
            .cleanup(PathBuf::from("/sys/fs/bpf").join(self.pin_name(l, k)));
        let cfg = self.path(l, k, "toml").display().to_string();
        l.lab.spawn(
            &name,
            &format!("lbd-{name}"),
            crate::bin_dir().join("lbd"),
            &["--config", &cfg],
        );
        self.lbd[k] = true;
        wait_for(Duration::from_secs(20), || {
            matches!(self.status(l, k)?["state"].as_str()?, "backup" | "master").then_some(())
        })
        .unwrap_or_else(|| panic!("lbd on {name} joins\n{}", l.lab.log(&format!("lbd-{name}"))));
    }

    /// Every worker's config rendered with `migrating`'s profile, the backup first; each lbd
    /// reloads it by itself.
    fn reprofile(&self, l: &VrrpLab, migrating: bool) {
        let h = self.holder(l);
        for k in [1 - h, h] {
            self.write_lbd_config(l, k, migrating);
            let want = if migrating { 1000 } else { 100 };
            wait_for(Duration::from_secs(15), || {
                (self.status(l, k)?["advert_interval_ms"].as_u64()? == want).then_some(())
            })
            .unwrap_or_else(|| panic!("{} reloads its new config", self.names[k]));
        }
    }
}

/// `cargo xtask bench migrate`: the rehearsal with `LB_MIGRATE_SECS` (default 15) of load per
/// step; writes target/bench/migrate.json.
pub fn run() {
    let secs = std::env::var("LB_MIGRATE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15u64)
        .max(5);
    let labnode = crate::bin_dir().join("labnode").display().to_string();
    let (steps, reference) = rehearse(&labnode, secs);
    super::write_json(
        "migrate",
        &json!({
            "steps": steps,
            "reference": reference,
            "secs_per_step": secs,
            "long_lived": LONG_LIVED,
            "new_per_s": SHORT_RATE,
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workers' description renders (both profiles) and OpenShift's keepalived.conf for it
    /// has the ingress instance only, with the other worker as its peer.
    #[test]
    fn the_workers_render_both_ways() {
        for migrating in [true, false] {
            let out = worker_spec(migrating).render().unwrap();
            assert_eq!(out.len(), 5);
            assert_eq!(out[FIRST_WORKER].node, WORKERS[0].0);
            let r = &out[FIRST_WORKER].config.vrrp;
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].vips, [INGRESS_VIP.parse::<IpAddr>().unwrap()]);
            assert_eq!(r[0].v2_compat, migrating);
        }
        let spec = worker_spec(true);
        let checks = Checks {
            ocp_lb: "a".into(),
            ocp_both: "b".into(),
            mcs: "c".into(),
            ingress: "d".into(),
            ingress_ready: "e".into(),
            default_ingress: "f".into(),
        };
        let conf = keepalived_conf(&spec, &spec.nodes[FIRST_WORKER], &checks);
        assert!(
            conf.contains("ostest_INGRESS_0") && !conf.contains("_API_"),
            "{conf}"
        );
        assert!(conf.contains(WORKERS[1].1), "{conf}");
    }

    #[test]
    fn dual_master_time_and_moves_from_samples() {
        let s = vec![
            vec![0],
            vec![0],
            vec![],
            vec![1],
            vec![0, 1],
            vec![1],
            vec![2],
        ];
        let (dual, moves) = summarize(&s);
        assert_eq!(dual, SAMPLE.as_secs_f64() * 1000.0);
        assert_eq!(moves, 2);
        assert_eq!(summarize(&[]), (0.0, 0));
    }
}
