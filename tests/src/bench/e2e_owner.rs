//! The e2e bench's look at the VIP owner: its whole CPU per request, like for like for haproxy
//! and lbd, and (optionally) a CPU profile of the machine during the short-connection runs.
//!
//! Whole CPU on the owner: on a veth lab, packet work runs in softirq context on whichever CPU
//! and task happened to trigger it, so neither a process's time nor the XDP program's run time
//! is the owner's whole cost. For this phase the owner's `eth0` and its bridge-side peer get
//! NAPI instances (GRO on) and threaded NAPI: everything the owner's receive path does (for lbd:
//! the XDP program, generic-mode skb handling and the XDP_TX transmit; for haproxy: its TCP/IP
//! receive path) then runs in the owner's own NAPI thread (TSO is off on both ends, or the veth
//! would bypass NAPI for TCP), and what leaves the owner is handed
//! to the peer's thread (the bridge and the backends), not charged to the owner. Owner CPU =
//! the load balancer's processes (haproxy, or lbd) + the owner's NAPI thread. The phase runs
//! after the throughput rounds, which keep the lab's normal (softirq) receive path.
use std::{path::PathBuf, process::Command, time::Duration};

use serde_json::{Value, json};

use super::e2e::{E2eLab, proc_cpu, run_wrk};
use crate::lab::{set_threaded_napi, thread_cpu_seconds, threaded_napi, try_sh};

/// One owner's receive path, made attributable; undone on drop.
struct OwnerThreads {
    /// (namespace, device) whose GRO and threaded NAPI were switched on.
    devices: Vec<(String, String)>,
    /// The owner's eth0 NAPI thread.
    rx_thread: Option<i32>,
}

/// GRO on and TSO off (`on`), or the veth defaults back. A veth hands a packet to its peer's
/// NAPI only when the peer has NAPI (GRO or XDP) and the sender does not do TSO.
fn napi_path(netns: &str, dev: &str, on: bool) -> bool {
    let (gro, tso) = if on { ("on", "off") } else { ("off", "on") };
    try_sh(&[
        "ip", "netns", "exec", netns, "ethtool", "-K", dev, "gro", gro, "tso", tso,
    ])
    .status
    .success()
}

impl OwnerThreads {
    fn new(l: &E2eLab, node: &str) -> OwnerThreads {
        let ns = l.lab.node(node).netns.clone();
        let sw = format!("{}-sw", l.lab.prefix);
        let mut t = OwnerThreads {
            devices: Vec::new(),
            rx_thread: None,
        };
        // The bridge-side peer first: it takes over what leaves the owner.
        for (netns, dev) in [(sw, node.to_string()), (ns, "eth0".to_string())] {
            if !napi_path(&netns, &dev, true) {
                eprintln!("GRO on / TSO off on {dev} ({netns}) failed");
            }
            let pid = threaded_napi(&netns, &dev);
            t.devices.push((netns, dev.clone()));
            if dev == "eth0" {
                t.rx_thread = pid;
            }
        }
        t
    }
}

impl Drop for OwnerThreads {
    fn drop(&mut self) {
        for (netns, dev) in &self.devices {
            set_threaded_napi(netns, dev, false);
            napi_path(netns, dev, false);
        }
    }
}

/// Owner CPU per request for haproxy and lbd, short and long connections, measured the same way.
pub(super) fn like_for_like(l: &E2eLab, targets: [(&str, &str, &str, u32); 2]) -> Vec<Value> {
    let mut rows = Vec::new();
    for (conns, short) in [("short", true), ("long", false)] {
        for (name, owner, target, pid) in targets {
            let threads = OwnerThreads::new(l, owner);
            let Some(rx) = threads.rx_thread else {
                eprintln!("owner CPU of {name}: no NAPI thread for {owner}'s eth0; skipped");
                continue;
            };
            // Let the threads settle into the path before counting.
            std::thread::sleep(Duration::from_millis(200));
            let (p0, k0) = (proc_cpu(pid), thread_cpu_seconds(rx));
            let (wrk, _) = run_wrk(l, target, short);
            let (proc_s, rx_s) = (proc_cpu(pid) - p0, thread_cpu_seconds(rx) - k0);
            drop(threads);
            if rx_s < 0.01 {
                eprintln!(
                    "owner CPU of {name}: its receive thread hardly ran ({rx_s:.3} s): the path bypassed it"
                );
            }
            let req = wrk.requests.max(1) as f64;
            let us = 1e6 * (proc_s + rx_s) / req;
            println!(
                "  owner CPU {name:<8} {conns:<5} {:>9.0} req/s  process {:>6.2} s + receive \
                 thread {:>6.2} s = {us:>6.1} us/request",
                wrk.rps, proc_s, rx_s
            );
            rows.push(json!({
                "name": name,
                "connections": conns,
                "rps": wrk.rps,
                "requests": wrk.requests,
                "process_cpu_s": proc_s,
                "receive_thread_cpu_s": rx_s,
                "owner_cpu_us_per_req": us,
            }));
        }
    }
    rows
}

/// `perf record` of the whole machine while `run` runs: the hottest symbols, written to
/// `<out>/e2e-profile-<name>.txt`. None when perf is missing or cannot sample.
pub(super) fn profile(name: &str, out: &std::path::Path, run: impl FnOnce()) -> Option<PathBuf> {
    let data = std::env::temp_dir().join(format!("{}-{name}.perf", crate::unique("e2eprof")));
    let mut rec = Command::new("perf")
        .args(["record", "-a", "-g", "-e", "cpu-clock", "-F", "999", "-o"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(500));
    run();
    // SIGINT lets perf write its file.
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    let _ = rec.wait();
    let report = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-g",
            "none",
            "--percent-limit",
            "0.3",
            "-i",
        ])
        .arg(&data)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&data);
    if !report.status.success() {
        return None;
    }
    let path = out.join(format!("e2e-profile-{name}.txt"));
    std::fs::write(&path, &report.stdout).ok()?;
    Some(path)
}
