//! Prometheus metrics through `prometheus-client` (OpenMetrics text), every metric prefixed `lb_`.
//!
//! Two kinds of metrics:
//! - snapshots of what the daemon already serves as JSON ([`render`]'s arguments), encoded
//!   afresh on every scrape, so metrics and `lbctl` can never disagree;
//! - observations that only exist over time: health-check durations, in process-wide families
//!   ([`observe_health_check`]) that every scrape includes.
//!
//! Conventions: counters end in `_total` (the library adds it), units are in the name
//! (`_seconds`, `_bytes`), and no label takes a value that changes with state: state is the
//! value (`lb_backend_up 0|1`), never a label, so a flapping backend does not create series.
//! The names are documented in docs/metrics.md.

use std::sync::LazyLock;

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use crate::status::{BackendRow, StatsRow, VipRow, VrrpCounters, VrrpRow, VrrpState};

type Labels = Vec<(String, String)>;

pub(crate) fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Every lbd metric starts with this (then `_`): `lb_` alone could collide with other exporters.
pub const PREFIX: &str = "lbd";

/// Health-check durations by VIP and backend (a tracked check: `track` = its name, `vip` and
/// `backend` empty) and check kind.
static HEALTH_CHECK_SECONDS: LazyLock<Family<Labels, Histogram>> = LazyLock::new(|| {
    // 1 ms to ~16 s: a local TCP connect to a hanging backend's full timeout.
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15)))
});

/// Record one health check's duration (called by the health monitor after every probe).
/// `target` is the check's id: `<vip>/<backend>` or `track/<name>`.
pub fn observe_health_check(target: &str, kind: &str, took: std::time::Duration) {
    HEALTH_CHECK_SECONDS
        .get_or_create(&check_target_labels(target, kind))
        .observe(took.as_secs_f64());
}

/// The label scheme's `vip`, `backend` (or `track`) and `kind` of a health-check id.
fn check_target_labels(target: &str, kind: &str) -> Labels {
    let (vip, backend, track) = match target.split_once('/') {
        Some(("track", name)) => ("", "", name),
        Some((vip, backend)) => (vip, backend, ""),
        None => ("", "", target),
    };
    labels(&[
        ("vip", vip.into()),
        ("backend", backend.into()),
        ("track", track.into()),
        ("kind", kind.into()),
    ])
}

fn register(
    r: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: impl prometheus_client::registry::Metric,
) {
    match unit {
        Some(u) => r.register_with_unit(name, help, u, metric),
        None => r.register(name, help, metric),
    }
}

pub(crate) fn counter_family(
    r: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) {
    let rows: Vec<(Labels, u64)> = rows.into_iter().collect();
    // The library appends the final period itself.
    let help = help.trim_end_matches('.');
    if let [(l, v)] = rows.as_slice()
        && l.is_empty()
    {
        let c = Counter::<u64>::default();
        c.inc_by(*v);
        return register(r, name, help, unit, c);
    }
    let f = Family::<Labels, Counter>::default();
    for (l, v) in rows {
        f.get_or_create(&l).inc_by(v);
    }
    register(r, name, help, unit, f)
}

pub(crate) fn gauge_family(
    r: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels, i64)>,
) {
    let rows: Vec<(Labels, i64)> = rows.into_iter().collect();
    let help = help.trim_end_matches('.');
    if let [(l, v)] = rows.as_slice()
        && l.is_empty()
    {
        let g = Gauge::<i64>::default();
        g.set(*v);
        return register(r, name, help, unit, g);
    }
    let f = Family::<Labels, Gauge>::default();
    for (l, v) in rows {
        f.get_or_create(&l).set(v);
    }
    register(r, name, help, unit, f)
}

/// The exposition, from the rows `/v1/stats`, `/v1/vips`, `/v1/backends` and `/v1/vrrp` serve,
/// with the `process_*` metrics of this process.
pub fn render(
    stats: &StatsRow,
    vips: &[VipRow],
    backends: &[BackendRow],
    vrrp: &[VrrpRow],
) -> String {
    let mut root = Registry::default();
    process::register(&mut root, stats.uptime_s);
    let r = root.sub_registry_with_prefix(PREFIX);
    gauge_family(
        r,
        "build_info",
        "Always 1; the labels say which lbd this is.",
        None,
        [(labels(&[("version", env!("CARGO_PKG_VERSION").into())]), 1)],
    );
    gauge_family(
        r,
        "ready",
        "1 when lbd is ready (/readyz answers 200: data plane attached, config applied, VRRP running).",
        None,
        [(Labels::new(), i64::from(stats.ready))],
    );
    counter_family(
        r,
        "xdp_packets",
        "Packets seen by the XDP program, by verdict or reason.",
        None,
        stats
            .counters
            .iter()
            .map(|(k, v)| (labels(&[("reason", k.clone())]), *v)),
    );
    gauge_family(
        r,
        "conntrack_entries",
        "Entries in the connection table (background count).",
        None,
        [(Labels::new(), stats.conntrack_entries as i64)],
    );
    gauge_family(
        r,
        "conntrack_capacity_entries",
        "Capacity of the connection table.",
        None,
        [(Labels::new(), i64::from(stats.conntrack_size))],
    );
    counter_family(
        r,
        "config_reloads",
        "Config reloads applied.",
        None,
        [(Labels::new(), stats.reloads)],
    );
    counter_family(
        r,
        "config_reload_failures",
        "Config reloads refused (the running config stayed).",
        None,
        [(Labels::new(), stats.reload_failures)],
    );
    gauge_family(
        r,
        "config_last_reload_successful",
        "0 while the last reload failed (the running config is older than the file), else 1.",
        None,
        [(Labels::new(), i64::from(stats.last_reload_error.is_none()))],
    );
    gauge_family(
        r,
        "syn_flood_mode",
        "1 while flood mode holds (new connections write no connection-table entry).",
        None,
        [(Labels::new(), i64::from(stats.syn_flood.active))],
    );

    let vip_labels = |v: &VipRow| {
        labels(&[
            ("vip", v.name.clone()),
            ("port", v.port_label()),
            ("protocol", v.protocol.clone()),
            ("address", v.vip.to_string()),
            // The instance that elects the owner; empty for BGP and static VIPs, which have no
            // single holder (the holder alerts select vrrp!="").
            ("vrrp", v.vrrp.clone().unwrap_or_default()),
        ])
    };
    gauge_family(
        r,
        "vip_owned",
        "1 if this node forwards the VIP service.",
        None,
        vips.iter().map(|v| (vip_labels(v), v.owned as i64)),
    );
    gauge_family(
        r,
        "vip_backends_active",
        "Backends of the VIP service receiving new flows.",
        None,
        vips.iter()
            .map(|v| (vip_labels(v), v.backends_active as i64)),
    );
    gauge_family(
        r,
        "vip_fail_open",
        "1 while every backend of the VIP service fails its checks by being slow or answering wrong and new flows go to them anyway (fail-open).",
        None,
        vips.iter().map(|v| (vip_labels(v), v.fail_open as i64)),
    );
    gauge_family(
        r,
        "vip_backends",
        "Backends of the VIP service, in any state.",
        None,
        vips.iter()
            .map(|v| (vip_labels(v), v.backends_total as i64)),
    );
    counter_family(
        r,
        "vip_packets",
        "Packets forwarded for the VIP service.",
        None,
        vips.iter().map(|v| (vip_labels(v), v.packets)),
    );
    counter_family(
        r,
        "vip",
        "Bytes forwarded for the VIP service.",
        Some(Unit::Bytes),
        vips.iter().map(|v| (vip_labels(v), v.bytes)),
    );
    counter_family(
        r,
        "vip_new_flows",
        "New flows of the VIP service.",
        None,
        vips.iter().map(|v| (vip_labels(v), v.new_flows)),
    );

    let be_labels = |b: &BackendRow| {
        labels(&[
            ("vip", b.vip_name.clone()),
            ("port", b.port_label()),
            ("backend", b.backend.to_string()),
        ])
    };
    gauge_family(
        r,
        "backend_up",
        "1 if the backend receives new flows (state active); the state itself is in lbctl.",
        None,
        backends
            .iter()
            .map(|b| (be_labels(b), (b.state == "active") as i64)),
    );
    gauge_family(
        r,
        "backend_healthy",
        "1 if the backend's last health verdict is up (or it is not checked).",
        None,
        backends.iter().map(|b| (be_labels(b), b.healthy as i64)),
    );
    gauge_family(
        r,
        "backend_expected",
        "1 if the backend is expected to serve; 0 while its check finds nothing listening on a VIP with absent_when_refused (an ingress node without a router).",
        None,
        backends.iter().map(|b| (be_labels(b), b.expected as i64)),
    );
    gauge_family(
        r,
        "backend_drained",
        "1 if an operator drained the backend.",
        None,
        backends.iter().map(|b| (be_labels(b), b.drained as i64)),
    );
    counter_family(
        r,
        "backend_packets",
        "Packets sent to the backend.",
        None,
        backends.iter().map(|b| (be_labels(b), b.packets)),
    );
    counter_family(
        r,
        "backend",
        "Bytes sent to the backend.",
        Some(Unit::Bytes),
        backends.iter().map(|b| (be_labels(b), b.bytes)),
    );
    counter_family(
        r,
        "backend_new_flows",
        "New flows sent to the backend.",
        None,
        backends.iter().map(|b| (be_labels(b), b.new_flows)),
    );
    // A backend serves every port of its VIP with one check: count checks once per backend.
    let mut checked = std::collections::BTreeMap::new();
    for b in backends {
        if let Some(c) = &b.check {
            checked.insert(
                (b.vip_name.clone(), b.backend.to_string()),
                (c.checks_run, c.checks_failed),
            );
        }
    }
    let check_labels =
        |(vip, be): &(String, String)| labels(&[("vip", vip.clone()), ("backend", be.clone())]);
    counter_family(
        r,
        "health_checks",
        "Health checks run against the backend.",
        None,
        checked.iter().map(|(k, (run, _))| (check_labels(k), *run)),
    );
    counter_family(
        r,
        "health_check_failures",
        "Health checks of the backend that failed.",
        None,
        checked
            .iter()
            .map(|(k, (_, failed))| (check_labels(k), *failed)),
    );
    r.register_with_unit(
        "health_check_duration",
        "Duration of health checks, by VIP and backend (or tracked check) and kind",
        Unit::Seconds,
        HEALTH_CHECK_SECONDS.clone(),
    );

    render_vrrp(r, vrrp);
    if let Some(sync) = &stats.sync {
        crate::sync::status::render_metrics(r, sync);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &root);
    out
}

fn render_vrrp(r: &mut Registry, instances: &[VrrpRow]) {
    // Not `instance`: Prometheus sets that label to the scrape target's address.
    let inst = |i: &VrrpRow| labels(&[("vrrp", i.instance.name.clone())]);
    // A state set: every state is always present with 0 or 1, so series never appear or vanish.
    let states = [
        VrrpState::Initialize,
        VrrpState::Backup,
        VrrpState::Master,
        VrrpState::Fault,
    ];
    gauge_family(
        r,
        "vrrp_state",
        "1 for the instance's current state, 0 for the others.",
        None,
        instances.iter().flat_map(|i| {
            states.iter().map(move |s| {
                let mut l = inst(i);
                l.push(("state".into(), s.as_str().to_lowercase()));
                (l, (i.instance.state == *s) as i64)
            })
        }),
    );
    // The expected lbd nodes, as each lbd knows them: a peer no Prometheus target answers for
    // is a node whose lbd is down or not scraped (alert LbNodeNotScraped).
    gauge_family(
        r,
        "vrrp_unicast_peer",
        "1 for each unicast peer of the instance (an address another lbd or keepalived speaks from).",
        None,
        instances.iter().flat_map(|i| {
            i.instance.unicast_peers.iter().map(move |p| {
                let mut l = inst(i);
                l.push(("peer".into(), p.to_string()));
                (l, 1)
            })
        }),
    );
    gauge_family(
        r,
        "vrrp_priority",
        "Configured base priority.",
        None,
        instances
            .iter()
            .map(|i| (inst(i), i64::from(i.instance.base_priority))),
    );
    gauge_family(
        r,
        "vrrp_effective_priority",
        "Priority advertised: base plus tracked weights.",
        None,
        instances
            .iter()
            .map(|i| (inst(i), i64::from(i.instance.effective_priority))),
    );
    type Field = fn(&VrrpCounters) -> u64;
    let fields: [(&str, Field, &str); 7] = [
        ("vrrp_transitions", |c| c.transitions, "State transitions."),
        (
            "vrrp_became_master",
            |c| c.became_master,
            "Transitions to master.",
        ),
        ("vrrp_adverts_sent", |c| c.adverts_sent, "Adverts sent."),
        (
            "vrrp_adverts_received",
            |c| c.adverts_received,
            "Valid adverts received.",
        ),
        (
            "vrrp_send_errors",
            |c| c.send_errors,
            "Adverts that could not be sent (socket errors).",
        ),
        (
            "vrrp_split_brain",
            |c| c.split_brain,
            "Other masters seen while master.",
        ),
        (
            "vrrp_vip_errors",
            |c| c.vip_errors,
            "Failures adding, removing or announcing a VIP.",
        ),
    ];
    for (metric, field, help) in fields {
        counter_family(
            r,
            metric,
            help,
            None,
            instances
                .iter()
                .map(|i| (inst(i), field(&i.instance.counters))),
        );
    }
    counter_family(
        r,
        "vrrp_drops",
        "Adverts dropped, by reason.",
        None,
        instances.iter().flat_map(|i| {
            i.instance.counters.drops.iter().map(move |(reason, v)| {
                let mut l = inst(i);
                l.push(("reason".into(), reason.to_string()));
                (l, *v)
            })
        }),
    );
    counter_family(
        r,
        "vrrp_collisions",
        "Adverts on our VRID whose VIP set or authentication differ from ours.",
        None,
        instances
            .iter()
            .map(|i| (inst(i), i.instance.collisions.total())),
    );
}

/// The standard `process_*` metrics (Prometheus client conventions), from /proc/self. Parsing
/// is pure; reading /proc fails quietly (the metric is left out, never invented).
mod process {
    use prometheus_client::{
        metrics::{counter::ConstCounter, gauge::ConstGauge},
        registry::Registry,
    };

    /// CPU seconds (user + system) from /proc/self/stat's text, given the clock tick rate.
    pub fn cpu_seconds(stat: &str, ticks_per_s: u64) -> Option<f64> {
        // The command name (field 2) is in parentheses and may hold spaces: skip past it.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
        let utime: u64 = f.get(11)?.parse().ok()?;
        let stime: u64 = f.get(12)?.parse().ok()?;
        (ticks_per_s > 0).then(|| (utime + stime) as f64 / ticks_per_s as f64)
    }

    /// A `Vm...: N kB` line of /proc/self/status, in bytes.
    pub fn status_bytes(status: &str, key: &str) -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let kb: u64 = line[key.len()..]
            .trim_start_matches(':')
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb * 1024)
    }

    /// The soft limit of "Max open files" in /proc/self/limits.
    pub fn max_fds(limits: &str) -> Option<u64> {
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line["Max open files".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn ticks_per_s() -> u64 {
        // SAFETY: sysconf reads a constant of the C library; no memory is passed.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        u64::try_from(t).unwrap_or(100)
    }

    pub fn register(r: &mut Registry, uptime_s: u64) {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        if let Some(cpu) = read("/proc/self/stat").and_then(|s| cpu_seconds(&s, ticks_per_s())) {
            r.register(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                ConstCounter::new(cpu),
            );
        }
        if let Some(status) = read("/proc/self/status") {
            for (name, key, help) in [
                (
                    "process_resident_memory_bytes",
                    "VmRSS",
                    "Resident memory size in bytes",
                ),
                (
                    "process_virtual_memory_bytes",
                    "VmSize",
                    "Virtual memory size in bytes",
                ),
            ] {
                if let Some(b) = status_bytes(&status, key) {
                    r.register(name, help, ConstGauge::new(b as i64));
                }
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            r.register(
                "process_open_fds",
                "Number of open file descriptors",
                ConstGauge::new(fds.count() as i64),
            );
        }
        if let Some(max) = read("/proc/self/limits").and_then(|l| max_fds(&l)) {
            r.register(
                "process_max_fds",
                "Maximum number of open file descriptors",
                ConstGauge::new(max as i64),
            );
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        r.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            ConstGauge::new(now.saturating_sub(uptime_s) as i64),
        );
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn proc_files_parse() {
            let stat =
                "1234 (lb d) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 4 0 100 1000 200";
            assert_eq!(cpu_seconds(stat, 100), Some(3.0));
            assert_eq!(cpu_seconds("garbage", 100), None);
            let status = "Name:\tlbd\nVmSize:\t  2048 kB\nVmRSS:\t   512 kB\n";
            assert_eq!(status_bytes(status, "VmRSS"), Some(512 * 1024));
            assert_eq!(status_bytes(status, "VmSize"), Some(2048 * 1024));
            let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
            assert_eq!(max_fds(limits), Some(1024));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::CheckRow;

    fn rows() -> (Vec<VipRow>, Vec<BackendRow>) {
        let vip = VipRow {
            name: "api".into(),
            vip: "192.168.111.5".parse().unwrap(),
            port: 6443,
            protocol: "tcp".into(),
            owned: true,
            vrrp: Some("api".into()),
            backends_active: 1,
            backends_total: 2,
            fail_open: false,
            packets: 10,
            bytes: 1500,
            new_flows: 3,
        };
        let be = |addr: &str, state: &str, healthy: bool| BackendRow {
            vip_name: "api".into(),
            vip: "192.168.111.5".parse().unwrap(),
            port: 6443,
            protocol: "tcp".into(),
            backend: addr.parse().unwrap(),
            mac: "02:00:00:00:00:01".into(),
            weight: 1,
            state: state.into(),
            reason: "x".into(),
            local: false,
            healthy,
            drained: false,
            expected: true,
            packets: 7,
            bytes: 700,
            new_flows: 2,
            check: Some(CheckRow {
                result: "ok".into(),
                duration_ms: Some(3),
                at_unix_ms: Some(1),
                checks_run: 40,
                checks_failed: 4,
            }),
        };
        (
            vec![vip],
            vec![
                be("192.168.111.20", "active", true),
                be("192.168.111.21", "down", false),
            ],
        )
    }

    /// Every family of the exposition (`# TYPE` lines) is in docs/metrics.md, under its full
    /// name (`_total` for counters).
    #[test]
    fn every_metric_is_documented() {
        let text = exposition();
        let doc = include_str!("../../docs/metrics.md");
        let mut missing = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            let shown = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            if !doc.contains(&format!("`{shown}`")) {
                missing.push(shown);
            }
        }
        assert!(
            missing.is_empty(),
            "undocumented in docs/metrics.md: {missing:?}"
        );
        // And the reverse: a name the doc shows (in a table or a query) that the exposition
        // does not have is stale.
        let families = families();
        for word in doc.split('`').skip(1).step_by(2) {
            for name in metric_names(word) {
                assert!(
                    families.contains(&name),
                    "docs/metrics.md names {name} ({word}), which lbd does not export"
                );
            }
        }
    }

    fn vrrp_rows() -> Vec<VrrpRow> {
        serde_json::from_value(serde_json::json!([{
            "name": "api", "interface": "eth0", "vrid": 5, "version": 3, "state": "master",
            "base_priority": 40, "effective_priority": 65, "primary_addr": "192.168.111.2",
            "master": "192.168.111.2", "advert_interval_ms": 1000,
            "master_advert_interval_ms": 1000, "vips": ["192.168.111.5"], "unicast_peers": ["192.168.111.3"],
            "owned": true, "last_transition": null, "last_split_brain": null,
            "last_send_error": null,
            "counters": {"transitions": 2, "became_master": 1, "adverts_sent": 100,
                         "adverts_received": 5, "send_errors": 3, "split_brain": 0,
                         "announcements": 0, "rebinds": 0, "mac_changes": 0,
                         "unconfirmed_link_down": 0,
                         "vip_errors": 0, "drops": {"bad_ttl": 1}},
            "collisions": {"peers": {}, "untracked": 0},
            "tracks": [], "track_weight": 25, "track_fault": false,
        }]))
        .unwrap()
    }

    /// A full exposition: every metric present.
    fn exposition() -> String {
        let (vips, backends) = rows();
        observe_health_check("track/api-up", "tcp", std::time::Duration::from_millis(1));
        let stats = StatsRow {
            counters: [("forwarded".to_string(), 1)].into(),
            // With `[sync]`: its families too.
            sync: Some(crate::sync::status::SyncRow {
                exceptions: 1,
                refused: crate::sync::status::RefusedRow {
                    auth: 1,
                    ..Default::default()
                },
                peers: vec![crate::sync::status::SyncPeerRow::new(
                    "192.168.111.22".parse().unwrap(),
                )],
                ..Default::default()
            }),
            ..Default::default()
        };
        render(&stats, &vips, &backends, &vrrp_rows())
    }

    /// The families of a full exposition.
    fn families() -> Vec<String> {
        exposition()
            .lines()
            .filter_map(|l| {
                Some(
                    l.strip_prefix("# TYPE ")?
                        .split_whitespace()
                        .next()?
                        .to_string(),
                )
            })
            .collect()
    }

    /// The metric names an expression reads.
    fn metric_names(expr: &str) -> Vec<String> {
        expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| (w.starts_with("lbd_") || w.starts_with("process_")) && !w.ends_with('_'))
            .map(|w| {
                let mut n = w;
                for suffix in ["_total", "_bucket", "_sum", "_count"] {
                    n = n.strip_suffix(suffix).unwrap_or(n);
                }
                n.to_string()
            })
            .collect()
    }

    /// The alerts and the dashboard read metrics lbd exports, and the alerts the operator's
    /// issue asks for are all there.
    #[test]
    fn alerts_and_dashboard_read_exported_metrics() {
        let families = families();
        let rule: serde_json::Value =
            serde_norway::from_str(include_str!("../../deploy/monitoring/prometheus-rule.yaml"))
                .unwrap();
        let mut alerts = Vec::new();
        for g in rule["spec"]["groups"].as_array().unwrap() {
            for r in g["rules"].as_array().unwrap() {
                let expr = r["expr"].as_str().unwrap();
                alerts.push(r["alert"].as_str().unwrap().to_string());
                for n in metric_names(expr) {
                    assert!(families.contains(&n), "{}: {n} is not exported", r["alert"]);
                }
                assert!(r["annotations"]["description"].is_string(), "{r:?}");
            }
        }
        for want in [
            "LbVipWithoutHolder",
            "LbVipWithTwoHolders",
            "LbVrrpFlapping",
            "LbVrrpVridCollision",
            "LbVipNoHealthyBackend",
            "LbBackendDown",
            "LbReloadFailing",
            "LbSynFloodMode",
            "LbNotReady",
        ] {
            assert!(alerts.iter().any(|a| a == want), "{want} missing");
        }
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../deploy/monitoring/dashboard.json")).unwrap();
        let mut read = 0;
        for p in dash["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                for n in metric_names(t["expr"].as_str().unwrap()) {
                    assert!(families.contains(&n), "dashboard {}: {n}", p["title"]);
                    read += 1;
                }
            }
        }
        assert!(read > 10);
    }

    fn scrape(text: &str) -> prometheus_parse::Scrape {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
    }

    fn value(s: &prometheus_parse::Scrape, name: &str, label: (&str, &str)) -> f64 {
        let sample = s
            .samples
            .iter()
            .find(|x| {
                x.metric == name && (label.0.is_empty() || x.labels.get(label.0) == Some(label.1))
            })
            .unwrap_or_else(|| panic!("no {name}{{{}={}}}", label.0, label.1));
        match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn exposition_parses_and_follows_the_conventions() {
        let (vips, backends) = rows();
        observe_health_check(
            "api/192.168.111.20",
            "https",
            std::time::Duration::from_millis(3),
        );
        let stats = StatsRow {
            uptime_s: 5,
            conntrack_entries: 2,
            conntrack_size: 1024,
            reloads: 1,
            counters: [("tx".to_string(), 9), ("pass".to_string(), 1)].into(),
            ..Default::default()
        };
        let vrrp = vrrp_rows();
        let text = render(&stats, &vips, &backends, &vrrp);
        let s = scrape(&text);
        assert_eq!(
            value(&s, "lbd_build_info", ("version", env!("CARGO_PKG_VERSION"))),
            1.0
        );
        assert_eq!(value(&s, "lbd_xdp_packets_total", ("reason", "tx")), 9.0);
        assert_eq!(value(&s, "lbd_vip_bytes_total", ("vip", "api")), 1500.0);
        assert_eq!(
            value(&s, "lbd_backend_up", ("backend", "192.168.111.20")),
            1.0
        );
        assert_eq!(
            value(&s, "lbd_backend_up", ("backend", "192.168.111.21")),
            0.0
        );
        assert_eq!(
            value(&s, "lbd_backend_bytes_total", ("backend", "192.168.111.21")),
            700.0
        );
        assert_eq!(
            value(
                &s,
                "lbd_health_check_failures_total",
                ("backend", "192.168.111.21")
            ),
            4.0
        );
        assert_eq!(
            value(&s, "lbd_vrrp_send_errors_total", ("vrrp", "api")),
            3.0
        );
        assert_eq!(value(&s, "lbd_vrrp_state", ("state", "master")), 1.0);
        assert_eq!(value(&s, "lbd_vrrp_state", ("state", "backup")), 0.0);
        assert_eq!(value(&s, "lbd_ready", ("", "")), 0.0);
        assert_eq!(
            value(&s, "lbd_config_last_reload_successful", ("", "")),
            1.0
        );
        // The process metrics of this very process.
        assert!(value(&s, "process_start_time_seconds", ("", "")) > 0.0);
        assert!(value(&s, "process_resident_memory_bytes", ("", "")) > 0.0);
        assert!(value(&s, "process_open_fds", ("", "")) >= 1.0);
        // The histogram: buckets by `le`, with the observation counted.
        let h = s
            .samples
            .iter()
            .find(|x| {
                x.metric == "lbd_health_check_duration_seconds"
                    && x.labels.get("vip") == Some("api")
                    && x.labels.get("backend") == Some("192.168.111.20")
            })
            .expect("health-check duration histogram");
        match &h.value {
            prometheus_parse::Value::Histogram(buckets) => {
                assert!(
                    buckets
                        .iter()
                        .any(|b| b.less_than >= 0.004 && b.count >= 1.0),
                    "{buckets:?}"
                );
            }
            other => panic!("not a histogram: {other:?}"),
        }
        for x in &s.samples {
            // No label carries state: the backend's series are the same whatever it is doing.
            assert!(
                x.labels.get("state").is_none() || x.metric == "lbd_vrrp_state",
                "{}: {:?}",
                x.metric,
                x.labels
            );
            // One prefix, and never the label Prometheus reserves for the scrape target.
            assert!(
                x.metric.starts_with("lbd_") || x.metric.starts_with("process_"),
                "{}",
                x.metric
            );
            assert!(x.labels.get("instance").is_none(), "{}", x.metric);
            // The one label scheme: a VIP is `vip`, a backend `backend`, a port `port`.
            for l in ["target", "address_port", "be", "service"] {
                assert!(x.labels.get(l).is_none(), "{}: {l}", x.metric);
            }
        }
        // Counters are named `_total`, and every family has help text.
        for family in [
            "lbd_xdp_packets",
            "lbd_vip_packets",
            "lbd_backend_new_flows",
            "lbd_vrrp_adverts_sent",
            "process_cpu_seconds",
        ] {
            assert!(s.docs.contains_key(family), "{family} documented");
            assert!(
                s.samples
                    .iter()
                    .any(|x| x.metric == format!("{family}_total")),
                "{family}_total"
            );
        }
        assert!(text.ends_with("# EOF\n"), "OpenMetrics framing");
    }
}
