//! `bench migrate`: the move from keepalived + haproxy to lb rehearsed on three control-plane
//! nodes under load, node by node with the steps docs/openshift.md gives, then one node back.
//!
//! The lab starts as OpenShift runs the API VIP today: on every node keepalived (VRRPv2,
//! `advert_int 1`, PASS auth, unicast peers, priority 40 plus a tracked script worth +28 that
//! passes: OpenShift's haproxy +20, apiserver +5, machine-config server +3) and haproxy in TCP
//! mode balancing over every node's server, reached through an nftables redirect of VIP:PORT
//! to 9445 (OpenShift's `ocp_nat` table). Every node is also a DSR backend (the VIP on lo, ARP
//! sysctls), as lb's rendered config makes it.
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
//! Per step: time with two holders of the VIP (eth0 sampled every 20 ms), new connections
//! attempted and failed (one at a time, 300 ms timeout), long-lived connections lost (8 that
//! echo a line every 200 ms), VIP moves (changes of the single holder).

use std::{
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    lab::{has_address, try_sh, wait_for},
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
}

/// OpenShift's tracked scripts on a healthy node: haproxy +20, apiserver +5, MCS +3.
const TRACKED: i32 = 28;
const SAMPLE: Duration = Duration::from_millis(20);
const LONG_LIVED: u32 = 8;

fn keepalived_opts() -> NodeOpts {
    NodeOpts {
        haproxy: true,
        track_weight: Some(TRACKED),
        ..NodeOpts::openshift_keepalived(40)
    }
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
fn write_lbd_config(l: &VrrpLab, i: usize) {
    let track =
        format!("\n[[track]]\ninstance = \"api\"\nname = \"chk_ocp\"\nweight = {TRACKED}\n");
    std::fs::write(l.config_path(i), l.config(i) + &track).unwrap();
}

/// Who holds the VIP on eth0, sampled beside the steps.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<usize>>>,
}

impl Sampler {
    fn start(l: &VrrpLab) -> Sampler {
        let netns: Vec<String> = l
            .nodes
            .iter()
            .map(|n| l.lab.node(n).netns.clone())
            .collect();
        let vip = l.vip.to_string();
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

fn spawn_client(l: &VrrpLab, labnode: &str, args: &[&str]) -> Child {
    l.lab
        .cmd("client", labnode)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the client")
}

fn output(c: Child) -> Value {
    c.wait_with_output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or(Value::Null)
}

/// Run `action` under load for `secs` seconds and measure it.
fn measure(
    l: &mut VrrpLab,
    labnode: &str,
    name: &str,
    secs: u64,
    action: impl FnOnce(&mut VrrpLab),
) -> Step {
    let s = secs.to_string();
    let shorts = spawn_client(l, labnode, &["connect-for", l.vip, PORT, &s, "1", "300"]);
    let long = spawn_client(
        l,
        labnode,
        &[
            "hold-ids",
            l.vip,
            PORT,
            &LONG_LIVED.to_string(),
            &(secs - 1).to_string(),
            "200",
            "3",
        ],
    );
    let sampler = Sampler::start(l);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    action(l);
    if let Some(rest) = Duration::from_secs(secs).checked_sub(start.elapsed()) {
        std::thread::sleep(rest);
    }
    let short = output(shorts);
    let long = output(long);
    let (dual_master_ms, vip_moves) = summarize(&sampler.finish());
    let count = |v: &Value| -> u64 {
        v.as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0)
    };
    let step = Step {
        step: name.to_string(),
        dual_master_ms,
        new_failed: short["failed"].as_u64().unwrap_or(0),
        new_attempted: short["ok"].as_u64().unwrap_or(0) + short["failed"].as_u64().unwrap_or(0),
        long_lived_lost: if long.is_null() {
            u64::from(LONG_LIVED)
        } else {
            count(&long["failed_by_id"])
        },
        vip_moves,
    };
    println!(
        "{:<36} {:>8.0} {:>6}/{:<6} {:>5} {:>5}",
        step.step,
        step.dual_master_ms,
        step.new_failed,
        step.new_attempted,
        step.long_lived_lost,
        step.vip_moves
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

fn remove_redirect(l: &VrrpLab, i: usize) {
    let netns = &l.lab.node(&l.nodes[i]).netns;
    let _ = try_sh(&[
        "nsenter",
        &format!("--net=/run/netns/{netns}"),
        "nft",
        "delete",
        "table",
        "ip",
        "lbt",
    ]);
}

/// Node `i` from keepalived + haproxy to lbd (the migration profile): the documented order.
fn to_lbd(l: &mut VrrpLab, i: usize) {
    l.stop(i, libc::SIGTERM);
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
    l.lab.make_dsr_backend(&n, &[l.vip]);
    l.opts[i] = keepalived_opts();
    l.write_keepalived_config(i);
    l.start(i);
    wait_for(Duration::from_secs(20), || {
        matches!(l.state(i).as_deref(), Some("backup" | "master")).then_some(())
    })
    .unwrap_or_else(|| panic!("keepalived on {} joins\n{}", l.nodes[i], l.logs()));
}

/// The whole rehearsal; `secs` of load per step. Returns (steps, reference).
pub fn rehearse(labnode: &str, secs: u64) -> (Vec<Step>, Vec<Step>) {
    // As on OpenShift: keepalived nodes do not hold the VIP on lo (they are no DSR backends).
    let mut l = VrrpLab::prepare(labnode, vec![keepalived_opts(); 3]);
    for i in 0..3 {
        l.start(i);
    }
    holder(&l);
    assert!(l.wait_serving(Duration::from_secs(20)), "{}", l.logs());
    println!(
        "{:<36} {:>8} {:>13} {:>5} {:>5}",
        "STEP", "DUAL_MS", "NEW_FAILED", "LOST", "MOVES"
    );
    let mut reference = Vec::new();
    reference.push(measure(
        &mut l,
        labnode,
        "reference: keepalived master restart",
        secs,
        |l| {
            let h = holder(l);
            l.stop(h, libc::SIGTERM);
            holder(l);
            l.start(h);
        },
    ));
    let mut steps = Vec::new();
    let h = holder(&l);
    let mut order: Vec<usize> = (0..3).filter(|i| *i != h).collect();
    order.push(h);
    for i in order {
        let name = format!("{} -> lb", l.nodes[i]);
        steps.push(measure(&mut l, labnode, &name, secs, |l| to_lbd(l, i)));
    }
    steps.push(measure(
        &mut l,
        labnode,
        "switch to VRRPv3 (reload)",
        secs,
        |l| reprofile(l, false),
    ));
    steps.push(measure(
        &mut l,
        labnode,
        "migration profile again (reload)",
        secs,
        |l| reprofile(l, true),
    ));
    let h = holder(&l);
    let back = (0..3).find(|i| *i != h).unwrap();
    let name = format!("{} -> keepalived", l.nodes[back]);
    steps.push(measure(&mut l, labnode, &name, secs, |l| {
        to_keepalived(l, back)
    }));
    (steps, reference)
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
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

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
