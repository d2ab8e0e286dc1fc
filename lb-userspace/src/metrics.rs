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

use crate::status::{BackendRow, VipRow};

type Labels = Vec<(String, String)>;

pub(crate) fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Health-check durations by target (`<vip>/<backend>` or `track/<name>`) and check kind.
static HEALTH_CHECK_SECONDS: LazyLock<Family<Labels, Histogram>> = LazyLock::new(|| {
    // 1 ms to ~16 s: a local TCP connect to a hanging backend's full timeout.
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15)))
});

/// Record one health check's duration (called by the health monitor after every probe).
pub fn observe_health_check(target: &str, kind: &str, took: std::time::Duration) {
    HEALTH_CHECK_SECONDS
        .get_or_create(&labels(&[("target", target.into()), ("kind", kind.into())]))
        .observe(took.as_secs_f64());
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

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The exposition. `stats` is the JSON of `/v1/stats`; `vrrp` the JSON array of `/v1/vrrp`.
pub fn render(
    stats: &serde_json::Value,
    vips: &[VipRow],
    backends: &[BackendRow],
    vrrp: &serde_json::Value,
) -> String {
    let mut r = Registry::with_prefix("lb");
    gauge_family(
        &mut r,
        "build_info",
        "Always 1; the labels say which lbd this is.",
        None,
        [(labels(&[("version", env!("CARGO_PKG_VERSION").into())]), 1)],
    );
    gauge_family(
        &mut r,
        "uptime",
        "Time since this lbd started.",
        Some(Unit::Seconds),
        [(Labels::new(), n(&stats["uptime_s"]) as i64)],
    );
    let counters = stats["counters"].as_object().cloned().unwrap_or_default();
    counter_family(
        &mut r,
        "xdp_packets",
        "Packets seen by the XDP program, by verdict or reason.",
        None,
        counters
            .iter()
            .map(|(k, v)| (labels(&[("reason", k.clone())]), n(v))),
    );
    gauge_family(
        &mut r,
        "conntrack_entries",
        "Entries in the connection table.",
        None,
        [(Labels::new(), n(&stats["conntrack_entries"]) as i64)],
    );
    gauge_family(
        &mut r,
        "conntrack_capacity_entries",
        "Capacity of the connection table.",
        None,
        [(Labels::new(), n(&stats["conntrack_size"]) as i64)],
    );
    counter_family(
        &mut r,
        "config_reloads",
        "Config reloads applied.",
        None,
        [(Labels::new(), n(&stats["reloads"]))],
    );
    gauge_family(
        &mut r,
        "new_connections_per_second",
        "SYNs to owned VIPs per second (last 100 ms window, all CPUs): a SYN flood shows here.",
        None,
        [(
            Labels::new(),
            stats["syn_flood"]["new_connections_per_s"]
                .as_u64()
                .unwrap_or(0) as i64,
        )],
    );
    gauge_family(
        &mut r,
        "syn_flood_mode",
        "1 while SYN flood mode holds on some CPU (SYNs write no connection-table entry).",
        None,
        [(
            Labels::new(),
            i64::from(stats["syn_flood"]["active"] == true),
        )],
    );
    counter_family(
        &mut r,
        "config_reload_failures",
        "Config reloads refused (the running config stayed).",
        None,
        [(Labels::new(), n(&stats["reload_failures"]))],
    );

    let vip_labels = |v: &VipRow| {
        labels(&[
            ("vip", v.name.clone()),
            ("address", v.vip.to_string()),
            ("port", v.port_label()),
            ("protocol", v.protocol.into()),
        ])
    };
    gauge_family(
        &mut r,
        "vip_owned",
        "1 if this node forwards the VIP service.",
        None,
        vips.iter().map(|v| (vip_labels(v), v.owned as i64)),
    );
    gauge_family(
        &mut r,
        "vip_backends_active",
        "Backends of the VIP service receiving new flows.",
        None,
        vips.iter()
            .map(|v| (vip_labels(v), v.backends_active as i64)),
    );
    counter_family(
        &mut r,
        "vip_packets",
        "Packets forwarded for the VIP service.",
        None,
        vips.iter().map(|v| (vip_labels(v), v.packets)),
    );
    counter_family(
        &mut r,
        "vip",
        "Bytes forwarded for the VIP service.",
        Some(Unit::Bytes),
        vips.iter().map(|v| (vip_labels(v), v.bytes)),
    );
    counter_family(
        &mut r,
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
        &mut r,
        "backend_up",
        "1 if the backend receives new flows (state active); the state itself is in lbctl.",
        None,
        backends
            .iter()
            .map(|b| (be_labels(b), (b.state == "active") as i64)),
    );
    gauge_family(
        &mut r,
        "backend_healthy",
        "1 if the backend's last health verdict is up (or it is not checked).",
        None,
        backends.iter().map(|b| (be_labels(b), b.healthy as i64)),
    );
    gauge_family(
        &mut r,
        "backend_drained",
        "1 if an operator drained the backend.",
        None,
        backends.iter().map(|b| (be_labels(b), b.drained as i64)),
    );
    counter_family(
        &mut r,
        "backend_packets",
        "Packets sent to the backend.",
        None,
        backends.iter().map(|b| (be_labels(b), b.packets)),
    );
    counter_family(
        &mut r,
        "backend",
        "Bytes sent to the backend.",
        Some(Unit::Bytes),
        backends.iter().map(|b| (be_labels(b), b.bytes)),
    );
    counter_family(
        &mut r,
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
        &mut r,
        "health_checks",
        "Health checks run against the backend.",
        None,
        checked.iter().map(|(k, (run, _))| (check_labels(k), *run)),
    );
    counter_family(
        &mut r,
        "health_check_failures",
        "Health checks of the backend that failed.",
        None,
        checked
            .iter()
            .map(|(k, (_, failed))| (check_labels(k), *failed)),
    );
    r.register_with_unit(
        "health_check_duration",
        "Duration of health checks, by target and kind",
        Unit::Seconds,
        HEALTH_CHECK_SECONDS.clone(),
    );

    if let Some(instances) = vrrp.as_array() {
        render_vrrp(&mut r, instances);
    }
    crate::sync::status::render_metrics(&mut r, &stats["sync"]);
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

fn render_vrrp(r: &mut Registry, instances: &[serde_json::Value]) {
    let inst =
        |i: &serde_json::Value| labels(&[("instance", i["name"].as_str().unwrap_or("").into())]);
    // A state set: every state is always present with 0 or 1, so series never appear or vanish.
    let states = ["initialize", "backup", "master", "fault"];
    gauge_family(
        r,
        "vrrp_state",
        "1 for the instance's current state, 0 for the others.",
        None,
        instances.iter().flat_map(|i| {
            let state = i["state"].as_str().unwrap_or("").to_lowercase();
            states.iter().map(move |s| {
                let mut l = inst(i);
                l.push(("state".into(), s.to_string()));
                (l, (state == *s) as i64)
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
            .map(|i| (inst(i), n(&i["base_priority"]) as i64)),
    );
    gauge_family(
        r,
        "vrrp_effective_priority",
        "Priority advertised: base plus tracked weights.",
        None,
        instances
            .iter()
            .map(|i| (inst(i), n(&i["effective_priority"]) as i64)),
    );
    for (metric, field, help) in [
        ("vrrp_transitions", "transitions", "State transitions."),
        (
            "vrrp_became_master",
            "became_master",
            "Transitions to master.",
        ),
        ("vrrp_adverts_sent", "adverts_sent", "Adverts sent."),
        (
            "vrrp_adverts_received",
            "adverts_received",
            "Valid adverts received.",
        ),
        (
            "vrrp_send_errors",
            "send_errors",
            "Adverts that could not be sent (socket errors).",
        ),
        (
            "vrrp_split_brain",
            "split_brain",
            "Other masters seen while master.",
        ),
        (
            "vrrp_vip_errors",
            "vip_errors",
            "Failures adding, removing or announcing a VIP.",
        ),
    ] {
        counter_family(
            r,
            metric,
            help,
            None,
            instances
                .iter()
                .map(|i| (inst(i), n(&i["counters"][field]))),
        );
    }
    counter_family(
        r,
        "vrrp_drops",
        "Adverts dropped, by reason.",
        None,
        instances.iter().flat_map(|i| {
            i["counters"]["drops"]
                .as_object()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |(reason, v)| {
                    let mut l = inst(i);
                    l.push(("reason".into(), reason));
                    (l, n(&v))
                })
        }),
    );
    counter_family(
        r,
        "vrrp_collisions",
        "Adverts on our VRID whose VIP set or authentication differ from ours.",
        None,
        instances.iter().map(|i| {
            let c = &i["collisions"];
            let total: u64 = c["peers"]
                .as_object()
                .map(|p| p.values().map(|x| n(&x["count"])).sum())
                .unwrap_or(0)
                + n(&c["untracked"]);
            (inst(i), total)
        }),
    );
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
            protocol: "tcp",
            owned: true,
            vrrp: Some("api".into()),
            backends_active: 1,
            backends_total: 2,
            packets: 10,
            bytes: 1500,
            new_flows: 3,
        };
        let be = |addr: &str, state: &'static str, healthy: bool| BackendRow {
            vip_name: "api".into(),
            vip: "192.168.111.5".parse().unwrap(),
            port: 6443,
            protocol: "tcp",
            backend: addr.parse().unwrap(),
            mac: "02:00:00:00:00:01".into(),
            weight: 1,
            state,
            reason: "x".into(),
            local: false,
            healthy,
            drained: false,
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
        let stats = serde_json::json!({
            "uptime_s": 5, "conntrack_entries": 2, "conntrack_size": 1024,
            "reloads": 1, "reload_failures": 0, "counters": {"tx": 9, "pass": 1},
        });
        let vrrp = serde_json::json!([{
            "name": "api", "state": "Master", "base_priority": 40, "effective_priority": 65,
            "counters": {"transitions": 2, "became_master": 1, "adverts_sent": 100,
                         "adverts_received": 5, "send_errors": 3, "split_brain": 0,
                         "vip_errors": 0, "drops": {"bad_ttl": 1}},
            "collisions": {"peers": {}, "untracked": 0},
        }]);
        let text = render(&stats, &vips, &backends, &vrrp);
        let s = scrape(&text);
        assert_eq!(
            value(&s, "lb_build_info", ("version", env!("CARGO_PKG_VERSION"))),
            1.0
        );
        assert_eq!(value(&s, "lb_xdp_packets_total", ("reason", "tx")), 9.0);
        assert_eq!(value(&s, "lb_vip_bytes_total", ("vip", "api")), 1500.0);
        assert_eq!(
            value(&s, "lb_backend_up", ("backend", "192.168.111.20")),
            1.0
        );
        assert_eq!(
            value(&s, "lb_backend_up", ("backend", "192.168.111.21")),
            0.0
        );
        assert_eq!(
            value(&s, "lb_backend_bytes_total", ("backend", "192.168.111.21")),
            700.0
        );
        assert_eq!(
            value(
                &s,
                "lb_health_check_failures_total",
                ("backend", "192.168.111.21")
            ),
            4.0
        );
        assert_eq!(
            value(&s, "lb_vrrp_send_errors_total", ("instance", "api")),
            3.0
        );
        assert_eq!(value(&s, "lb_vrrp_state", ("state", "master")), 1.0);
        assert_eq!(value(&s, "lb_vrrp_state", ("state", "backup")), 0.0);
        assert_eq!(value(&s, "lb_uptime_seconds", ("", "")), 5.0);
        // The histogram: buckets by `le`, with the observation counted.
        let h = s
            .samples
            .iter()
            .find(|x| {
                x.metric == "lb_health_check_duration_seconds"
                    && x.labels.get("target") == Some("api/192.168.111.20")
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
        // No label carries state: the backend's series are the same whatever it is doing.
        for x in &s.samples {
            assert!(
                x.labels.get("state").is_none() || x.metric == "lb_vrrp_state",
                "{}: {:?}",
                x.metric,
                x.labels
            );
            if let Some(help) = s.docs.get(x.metric.trim_end_matches("_total")) {
                assert!(!help.is_empty());
            }
        }
        // Counters are named `_total`, and every family has help text.
        for family in [
            "lb_xdp_packets",
            "lb_vip_packets",
            "lb_backend_new_flows",
            "lb_vrrp_adverts_sent",
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
