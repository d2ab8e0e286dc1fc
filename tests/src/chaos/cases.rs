//! The twelve faults, what each may cost the clients, and one case's run and measurement.

use std::{collections::BTreeMap, time::Duration};

use super::{
    CaseResult, Chaos, FAILOVER_FAILED_SHARE, FAILOVER_GAP_MS, NO_GAP_MS, other_cp,
    sampler::{self, PERIOD},
};
use crate::{
    bin_dir,
    cluster::{API_VIP, CONTROL_PLANE, ECHO_PORT, HOSTILE, HOSTILE_ADDR, node_addr},
    lab::{sh, try_sh},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Case {
    NodeDies = 1,
    OwnerSigkill,
    OwnerSigterm,
    BackupSigkill,
    InterfaceRecreated,
    LinkFlap,
    Reload,
    ApiserverFlap,
    BackendMacChange,
    HostileAdverts,
    SynFlood,
    Partition,
    /// Every control-plane node in turn goes down (lbd stopped gracefully, its backend, its
    /// link) and comes back, each once the previous one serves again: an upgrade's reboots.
    RollingUpgrade,
    /// One node of [`Case::RollingUpgrade`]: the API VIP owner's (the short run in
    /// `cargo xtask test`; not in [`Case::ALL`]).
    UpgradeOneNode,
}

/// What a case may cost the clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// A node or its daemon/link/interface fails: at most 1 % of new connections fail and no
    /// gap over [`FAILOVER_GAP_MS`].
    Failover,
    /// Planned work (SIGTERM, reloads, a backend's readiness flapping) and faults that must
    /// not show at all (a backup's daemon, hostile adverts): nothing fails, no gap over
    /// [`NO_GAP_MS`].
    Nothing,
}

impl Case {
    pub const ALL: [Case; 13] = [
        Case::NodeDies,
        Case::OwnerSigkill,
        Case::OwnerSigterm,
        Case::BackupSigkill,
        Case::InterfaceRecreated,
        Case::LinkFlap,
        Case::Reload,
        Case::ApiserverFlap,
        Case::BackendMacChange,
        Case::HostileAdverts,
        Case::SynFlood,
        Case::Partition,
        Case::RollingUpgrade,
    ];

    pub fn number(self) -> u8 {
        self as u8
    }

    pub fn from_number(n: u8) -> Option<Case> {
        Case::ALL
            .iter()
            .chain(&[Case::UpgradeOneNode])
            .copied()
            .find(|c| c.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            Case::NodeDies => "owner-node-dies",
            Case::OwnerSigkill => "owner-lbd-sigkill",
            Case::OwnerSigterm => "owner-lbd-sigterm",
            Case::BackupSigkill => "backup-lbd-sigkill",
            Case::InterfaceRecreated => "owner-interface-recreated",
            Case::LinkFlap => "owner-link-flap-2s",
            Case::Reload => "reload-one-instance-and-bad-file",
            Case::ApiserverFlap => "apiserver-flap-10s",
            Case::BackendMacChange => "backend-mac-change",
            Case::HostileAdverts => "hostile-vrrp-adverts",
            Case::SynFlood => "syn-flood-10x-conntrack",
            Case::Partition => "partition-owner-5s",
            Case::RollingUpgrade => "rolling-upgrade-every-cp-node",
            Case::UpgradeOneNode => "upgrade-owner-node",
        }
    }

    pub fn budget(self) -> Budget {
        match self {
            Case::OwnerSigterm
            | Case::BackupSigkill
            | Case::Reload
            | Case::ApiserverFlap
            | Case::HostileAdverts => Budget::Nothing,
            _ => Budget::Failover,
        }
    }
}

/// The SYN flood's rate: 10x a 4096-entry table takes about 4 s, long enough for the client
/// load to run through it.
const FLOOD_PPS: u64 = 10_000;

/// What the fault did, for the measurement.
struct Injected {
    /// When the fault was over (healed, restarted, restored): ms on the load's clock.
    healed_at: u64,
    /// Nodes that died: their backends' connections cannot survive.
    dead: Vec<String>,
    /// Long-lived connections on each dead node's backend when it went (None: counted at the
    /// case's start).
    expected_by_backend: Option<BTreeMap<String, u64>>,
    /// Findings of the fault itself (e.g. a bad reload that was accepted).
    notes: Vec<String>,
}

/// A reboot of `node` after it died: its links come back with nothing the dead daemon left,
/// then its services and daemon start.
fn revive(ch: &mut Chaos, node: &str) {
    ch.flavor.reboot_cleanup(node);
    ch.set_link(node, true);
    ch.flavor.start_services(node);
    ch.start_daemon(node);
}

/// The nodes of an upgrade in the order they go: the owner's first (its VIP moves), then the
/// others, so a later node to go is the new owner, holding connections opened while an
/// earlier node's backend was away (exceptions its peers need).
fn upgrade_order(case: Case, owner: &str) -> Vec<String> {
    let mut v = vec![owner.to_string()];
    if case == Case::RollingUpgrade {
        v.extend(other_cp(owner).iter().map(|n| n.to_string()));
    }
    v
}

/// One node of an upgrade, as a reboot runs it: its apiserver turns not ready (graceful
/// termination) and the load balancers take it out of new connections; its lbd stops
/// gracefully (SIGTERM: a VIP it holds moves); its services (backend) stop; its link goes down;
/// after `down` it comes back as a clean node. Returns the long-lived connections its backend
/// held when the backend stopped: those are lost with it, and no others may be.
fn upgrade_node(ch: &mut Chaos, node: &str, down: Duration) -> (u64, BTreeMap<String, u64>) {
    let ready = ch.flavor.lab().dir.join(format!("{node}.ready"));
    let _ = std::fs::remove_file(&ready);
    std::thread::sleep(Duration::from_millis(ch.flavor.drain_ms()));
    ch.flavor.stop_daemon(node, libc::SIGTERM);
    let all = ch.load.long_by_backend();
    let on = all.get(node).copied().unwrap_or(0);
    ch.flavor.stop_services(node);
    ch.set_link(node, false);
    std::thread::sleep(down);
    std::fs::write(&ready, "").unwrap();
    revive(ch, node);
    (on, all)
}

fn inject(ch: &mut Chaos, case: Case, owner: &str, seed: u64) -> Injected {
    let mut notes = Vec::new();
    let mut dead = Vec::new();
    let mut expected_by_backend = None;
    let secs = Duration::from_secs;
    match case {
        Case::NodeDies => {
            // Links first: nothing more leaves the node, then every process dies.
            ch.set_link(owner, false);
            ch.flavor.stop_daemon(owner, libc::SIGKILL);
            ch.flavor.stop_services(owner);
            dead.push(owner.to_string());
            std::thread::sleep(secs(5));
            revive(ch, owner);
        }
        Case::RollingUpgrade | Case::UpgradeOneNode => {
            let mut expected = BTreeMap::new();
            let order = upgrade_order(case, owner);
            for (i, node) in order.iter().enumerate() {
                let before = ch.owner().unwrap_or_else(|| "?".into());
                let (on, all) = upgrade_node(ch, node, secs(5));
                *expected.entry(node.clone()).or_default() += on;
                dead.push(node.clone());
                let at = ch.now_ms();
                // The next node goes only once this one serves again (an upgrade waits for
                // the node to be Ready); the last one is waited for by the harness.
                let healthy = if i + 1 < order.len() {
                    ch.wait_healthy(at, super::HEAL_TIMEOUT)
                } else {
                    Ok(())
                };
                notes.push(format!(
                    "{node} down: {on} long-lived connections on its backend (all up: {all:?}); API VIP {before}>{}{}",
                    ch.owner().unwrap_or_else(|| "?".into()),
                    match healthy {
                        Ok(()) => String::new(),
                        Err(e) => format!("; not healthy before the next node: {e}"),
                    }
                ));
            }
            expected_by_backend = Some(expected);
        }
        Case::OwnerSigkill | Case::OwnerSigterm | Case::BackupSigkill => {
            let (node, sig) = match case {
                Case::OwnerSigkill => (owner.to_string(), libc::SIGKILL),
                Case::OwnerSigterm => (owner.to_string(), libc::SIGTERM),
                _ => (other_cp(owner)[0].to_string(), libc::SIGKILL),
            };
            ch.flavor.stop_daemon(&node, sig);
            std::thread::sleep(secs(2));
            ch.start_daemon(&node);
        }
        Case::InterfaceRecreated => {
            ch.replace_link(owner, Duration::from_millis(500), None);
        }
        Case::LinkFlap => {
            ch.set_link(owner, false);
            std::thread::sleep(secs(2));
            ch.set_link(owner, true);
        }
        Case::Reload => {
            let changed = ch.flavor.changed_config(owner);
            if let Err(e) = ch.flavor.reload(owner, &changed) {
                notes.push(format!("reload with one instance changed refused: {e}"));
            }
            std::thread::sleep(secs(2));
            if ch.flavor.reload(owner, "this is not [ a config").is_ok() {
                notes.push("a reload with a bad file was accepted".into());
            }
            std::thread::sleep(secs(1));
            // Back to the cluster's own config, so later cases start from the same place.
            let base = ch.flavor.base_config(owner);
            if let Err(e) = ch.flavor.reload(owner, &base) {
                notes.push(format!("reload back to the base config refused: {e}"));
            }
        }
        Case::ApiserverFlap => {
            let ready = ch.flavor.lab().dir.join(format!("{owner}.ready"));
            for i in 0..10 {
                if i % 2 == 0 {
                    let _ = std::fs::remove_file(&ready);
                } else {
                    std::fs::write(&ready, "").unwrap();
                }
                std::thread::sleep(secs(1));
            }
            std::fs::write(&ready, "").unwrap();
        }
        Case::BackendMacChange => {
            // A backend that is not the owner: the owner must follow its new MAC.
            let node = other_cp(owner)[seed as usize % 2];
            let mac = format!("02:c4:a0:5e:{:02x}:{:02x}", (seed >> 8) as u8, seed as u8);
            ch.replace_link(node, Duration::from_millis(200), Some(mac));
        }
        Case::HostileAdverts => {
            hostile_adverts(ch, owner, &mut notes);
        }
        Case::SynFlood => {
            let count = 10 * u64::from(ch.flavor.conntrack_size());
            let out = ch
                .flavor
                .lab()
                .cmd(HOSTILE, bin_dir().join("hostile"))
                .args([
                    "syn-flood",
                    "--dst",
                    API_VIP,
                    "--port",
                    ECHO_PORT,
                    "--count",
                    &count.to_string(),
                    "--pps",
                    &FLOOD_PPS.to_string(),
                    "--seed",
                    &(seed | 1).to_string(),
                ])
                .output()
                .expect("run hostile syn-flood");
            notes.push(format!(
                "flood: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        }
        Case::Partition => {
            let sw = ch.switch();
            let table = crate::unique("chaos");
            let rules = format!(
                "table bridge {table} {{\n chain drop_vrrp {{\n  type filter hook forward priority 0; policy accept;\n  iifname \"{owner}\" ip protocol 112 drop\n  oifname \"{owner}\" ip protocol 112 drop\n }}\n}}\n"
            );
            let file = ch.flavor.lab().dir.join(format!("{table}.nft"));
            std::fs::write(&file, rules).unwrap();
            sh(&[
                "nsenter",
                &format!("--net=/run/netns/{sw}"),
                "nft",
                "-f",
                &file.display().to_string(),
            ]);
            std::thread::sleep(secs(5));
            sh(&[
                "nsenter",
                &format!("--net=/run/netns/{sw}"),
                "nft",
                "delete",
                "table",
                "bridge",
                &table,
            ]);
        }
    }
    Injected {
        healed_at: ch.now_ms(),
        dead,
        expected_by_backend,
        notes,
    }
}

/// (a) another cluster's VIP set on our VRID, (b) a non-peer sending to our unicast instance,
/// (c) priority-0 adverts spoofing the master's address, each for 2 s at 10 per second.
fn hostile_adverts(ch: &mut Chaos, owner: &str, notes: &mut Vec<String>) {
    let lab = ch.flavor.lab();
    let ns = lab.node(HOSTILE).netns.clone();
    // Multicast leaves through eth0 (the namespace has no default route).
    let _ = try_sh(&[
        "ip",
        "-n",
        &ns,
        "route",
        "replace",
        "224.0.0.0/4",
        "dev",
        "eth0",
    ]);
    let (api_vrid, _) = lb_userspace::vrrp::vrids::openshift_vrids(crate::cluster::CLUSTER);
    let vrid = api_vrid.to_string();
    let all_cp: Vec<String> = CONTROL_PLANE.iter().map(|n| node_addr(n)).collect();
    let backups: Vec<String> = other_cp(owner).iter().map(|n| node_addr(n)).collect();
    let owner_addr = node_addr(owner);
    let phases: [(&str, &str, String, String, String); 3] = [
        (
            "other VIP set",
            "255",
            "10.79.0.99".into(),
            HOSTILE_ADDR.into(),
            format!("224.0.0.18,{}", all_cp.join(",")),
        ),
        (
            "non-peer unicast",
            "255",
            API_VIP.into(),
            HOSTILE_ADDR.into(),
            all_cp.join(","),
        ),
        (
            "priority 0 as the master",
            "0",
            API_VIP.into(),
            owner_addr,
            format!("224.0.0.18,{}", backups.join(",")),
        ),
    ];
    for (what, prio, vips, src, dst) in phases {
        let out = lab
            .cmd(HOSTILE, bin_dir().join("hostile"))
            .args([
                "adverts",
                "--vrid",
                &vrid,
                "--priority",
                prio,
                "--vips",
                &vips,
                "--src",
                &src,
                "--dst",
                &dst,
                "--count",
                "20",
                "--interval-ms",
                "100",
            ])
            .output()
            .expect("run hostile adverts");
        notes.push(format!(
            "adverts ({what}): {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        // Adverts that do not forge the master must never move the VIP. A resignation forged
        // in the master's name is a resignation by the protocol (priority 0 is acted on after
        // the skew only, as keepalived does): the master answers one it hears at once, but one
        // sent only to the backups can move the VIP (RFC 5798 section 9's on-segment limit);
        // its cost (failed connections, gap, two holders) is held to the case's budget.
        let now = ch.owner();
        if prio != "0" && now.as_deref() != Some(owner) {
            notes.push(format!(
                "{MOVED} from {owner} to {} by adverts that do not forge the master ({what})",
                now.unwrap_or_else(|| "?".into())
            ));
        } else if prio == "0" {
            notes.push(format!(
                "owner after the forged resignations: {}",
                now.unwrap_or_else(|| "?".into())
            ));
        }
    }
}

/// Marks a note of [`hostile_adverts`]: the VIP moved where it must not have.
const MOVED: &str = "the API VIP moved";

/// The longest stretch in `[from, to)` without an answered new connection, per target; ms.
fn max_gap(ends: &mut [u64], from: u64, to: u64) -> f64 {
    ends.sort_unstable();
    let mut last = from;
    let mut gap = 0;
    for &e in ends.iter().chain(std::iter::once(&to)) {
        gap = gap.max(e.saturating_sub(last));
        last = e;
    }
    gap as f64
}

/// Per backend, the long-lived connections lost beyond those `expected` (what its node held
/// when it went down; nothing for a backend whose node stayed up).
pub fn lost_beyond_expected(
    lost: &BTreeMap<String, u64>,
    expected: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    lost.iter()
        .filter_map(|(b, n)| {
            let e = expected.get(b).copied().unwrap_or(0);
            (*n > e).then(|| (b.clone(), n - e))
        })
        .collect()
}

/// Run one case from a healthy cluster; `seed` varies the fault's details.
pub fn run_case(ch: &mut Chaos, case: Case, seed: u64) -> CaseResult {
    let mut r = CaseResult {
        name: case.name().to_string(),
        ..Default::default()
    };
    ch.load.renew_long();
    let t_pre = ch.now_ms();
    if let Err(e) = ch.wait_healthy(t_pre, super::HEAL_TIMEOUT) {
        r.notes.push(format!("not healthy before the case: {e}"));
    }
    let (restarts0, crashes0) = ch.restarts();
    let Some(owner) = ch.wait_owner() else {
        r.notes
            .push("MISSED: no single API VIP owner at the start; not run".into());
        return r;
    };
    r.owner_before = owner.clone();
    let start = ch.now_ms();
    // Connections on each backend when the fault hits (for the expected losses).
    let on_backend: BTreeMap<String, u64> =
        ch.load
            .long_backends()
            .into_iter()
            .flatten()
            .fold(BTreeMap::new(), |mut m, b| {
                *m.entry(b).or_default() += 1;
                m
            });
    let injected = inject(ch, case, &owner, seed);
    r.notes.extend(injected.notes);
    let healthy = ch.wait_healthy(injected.healed_at, super::HEAL_TIMEOUT);
    let end = ch.now_ms();
    r.healthy_again = healthy.is_ok();
    if let Err(e) = healthy {
        r.notes.push(format!(
            "not healthy again within {:?}: {e}",
            super::HEAL_TIMEOUT
        ));
    }
    r.duration_ms = end - start;
    r.owner_after = ch.owner().unwrap_or_else(|| "?".into());
    let (restarts1, crashes1) = ch.restarts();
    r.daemon_restarts = restarts1 - restarts0;
    r.daemon_crashes = crashes1 - crashes0;

    let shorts = ch.load.shorts(start, end);
    r.new_attempted = shorts.len() as u64;
    r.new_failed = shorts.iter().filter(|s| s.result.is_err()).count() as u64;
    for s in &shorts {
        if let Err(e) = &s.result {
            *r.errors.entry(e.clone()).or_default() += 1;
        }
    }
    // When the failed ones started, per target (ms from the case's start).
    let mut failed_at: BTreeMap<usize, (u64, u64, u64)> = BTreeMap::new();
    for s in shorts.iter().filter(|s| s.result.is_err()) {
        let e = failed_at
            .entry(s.target)
            .or_insert((0, s.start - start, s.start - start));
        e.0 += 1;
        e.1 = e.1.min(s.start - start);
        e.2 = e.2.max(s.start - start);
    }
    if !failed_at.is_empty() {
        r.notes.push(format!(
            "failed new connections by target: {}",
            failed_at
                .iter()
                .map(|(t, (n, a, b))| format!("target {t}: {n} started {a}-{b} ms"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    r.skipped_slots = ch.load.skipped(start, end) as u64;
    let targets = shorts.iter().map(|s| s.target).max().map_or(0, |m| m + 1);
    r.max_gap_ms = (0..targets.max(2))
        .map(|t| {
            let mut ends: Vec<u64> = shorts
                .iter()
                .filter(|s| s.target == t && s.result.is_ok())
                .map(|s| s.end)
                .collect();
            max_gap(&mut ends, start, end)
        })
        .fold(0.0, f64::max);
    let lost = ch.load.lost(start, end);
    r.long_lived_lost = lost.len() as u64;
    if let (Some(first), Some(last)) = (
        lost.iter().map(|l| l.at).min(),
        lost.iter().map(|l| l.at).max(),
    ) {
        r.notes.push(format!(
            "long-lived losses from {} to {} ms after the fault (fault over at {} ms)",
            first - start,
            last - start,
            injected.healed_at - start
        ));
    }
    for l in &lost {
        *r.lost_by_backend.entry(l.backend.clone()).or_default() += 1;
        *r.errors
            .entry(format!("long-lived {}", l.error))
            .or_default() += 1;
    }
    let expected = injected.expected_by_backend.clone().unwrap_or_else(|| {
        injected
            .dead
            .iter()
            .map(|d| (d.clone(), on_backend.get(d).copied().unwrap_or(0)))
            .collect()
    });
    r.long_lived_lost_expected = expected.values().sum();
    r.lost_expected_by_backend = expected.clone();
    let samples = ch.sampler.samples(start, end);
    r.dual_master_ms = sampler::dual_ms(&samples);
    let mut seen: Vec<String> = Vec::new();
    for smp in &samples {
        for (v, h) in smp.holders.iter().enumerate() {
            if h.len() >= 2 {
                let names: Vec<&str> = h.iter().map(|i| super::NODES[*i]).collect();
                let d = format!("{} held by {}", super::VIPS[v], names.join("+"));
                if !seen.contains(&d) {
                    seen.push(d);
                }
            }
        }
    }
    if !seen.is_empty() {
        r.notes
            .push(format!("two holders seen: {}", seen.join(", ")));
    }

    // The targets.
    let interval = ch.flavor.advert_ms();
    let slack = PERIOD.as_millis() as f64;
    let mut miss = Vec::new();
    if !r.healthy_again {
        miss.push("did not return to healthy".to_string());
    }
    if r.long_lived_lost != r.long_lived_lost_expected {
        miss.push(format!(
            "long-lived lost {} (by backend {:?}), expected {}",
            r.long_lived_lost, r.lost_by_backend, r.long_lived_lost_expected
        ));
    }
    // Only connections whose backend was on a node that went down may be lost, and no more of
    // them than it held then (a total that matches by chance does not hide one lost elsewhere).
    let beyond = lost_beyond_expected(&r.lost_by_backend, &expected);
    if !beyond.is_empty() {
        miss.push(format!(
            "long-lived lost on backends that stayed up (or more than their node held): {beyond:?}"
        ));
        // Which connections, opened when (ms from the case's start; negative: before it):
        // enough to tell a connection lost twice from one the count missed.
        let ms = |t: u64| t as i64 - start as i64;
        let each: Vec<String> = lost
            .iter()
            .map(|l| {
                format!(
                    "#{} to {} opened {} on {} lost {}: {}",
                    l.conn,
                    l.target,
                    ms(l.opened),
                    l.backend,
                    ms(l.at),
                    l.error
                )
            })
            .collect();
        r.notes.push(format!(
            "connections on each backend at the start: {on_backend:?}; lost: {}",
            each.join(", ")
        ));
    }
    match case.budget() {
        Budget::Failover => {
            let share = r.new_failed as f64 / r.new_attempted.max(1) as f64;
            if share > FAILOVER_FAILED_SHARE {
                miss.push(format!("{:.2} % of new connections failed", share * 100.0));
            }
            if r.max_gap_ms > FAILOVER_GAP_MS {
                miss.push(format!("gap {:.0} ms", r.max_gap_ms));
            }
        }
        Budget::Nothing => {
            if r.new_failed > 0 {
                miss.push(format!("{} new connections failed", r.new_failed));
            }
            if r.max_gap_ms > NO_GAP_MS {
                miss.push(format!("gap {:.0} ms", r.max_gap_ms));
            }
        }
    }
    if case == Case::Partition {
        // Two holders are expected while partitioned; it must end within one advert interval
        // of the heal.
        if let Some(e) = sampler::dual_end(&samples)
            && e as f64 > injected.healed_at as f64 + interval + slack
        {
            miss.push(format!(
                "two holders until {:.0} ms after the heal",
                e as f64 - injected.healed_at as f64
            ));
        }
    } else if r.dual_master_ms > interval + slack {
        miss.push(format!("two VIP holders for {:.0} ms", r.dual_master_ms));
    }
    if case == Case::HostileAdverts
        && let Some(n) = r.notes.iter().find(|n| n.starts_with(MOVED))
    {
        miss.push(n.clone());
    }
    if r.notes
        .iter()
        .any(|n| n.contains("accepted") || n.contains("refused"))
    {
        miss.push("reload outcome wrong".into());
    }
    r.ok = miss.is_empty();
    r.notes
        .extend(miss.into_iter().map(|m| format!("MISSED: {m}")));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
        v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn only_losses_beyond_a_downed_nodes_backend_count() {
        let expected = m(&[("cp1", 30), ("cp2", 40)]);
        assert!(lost_beyond_expected(&m(&[("cp1", 30), ("cp2", 40)]), &expected).is_empty());
        assert!(lost_beyond_expected(&m(&[("cp1", 12)]), &expected).is_empty());
        // A total that matches still hides a loss on a backend that stayed up.
        assert_eq!(
            lost_beyond_expected(&m(&[("cp1", 30), ("cp2", 35), ("cp3", 5)]), &expected),
            m(&[("cp3", 5)])
        );
        assert_eq!(
            lost_beyond_expected(&m(&[("cp2", 41)]), &expected),
            m(&[("cp2", 1)])
        );
    }

    #[test]
    fn an_upgrade_takes_the_owner_first_then_every_other_node() {
        assert_eq!(upgrade_order(Case::UpgradeOneNode, "cp2"), ["cp2"]);
        assert_eq!(
            upgrade_order(Case::RollingUpgrade, "cp2"),
            ["cp2", "cp1", "cp3"]
        );
        assert_eq!(Case::from_number(14), Some(Case::UpgradeOneNode));
        assert!(!Case::ALL.contains(&Case::UpgradeOneNode));
    }
}
