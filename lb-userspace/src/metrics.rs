//! Prometheus text exposition, every metric prefixed `lb_`. Pure: renders snapshots the daemon
//! already serves as JSON, so metrics and `lbctl` can never disagree.

use std::fmt::Write as _;

use crate::daemon::{BackendRow, VipRow};

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// `stats` is the JSON of `/v1/stats`; `vrrp` the JSON array of `/v1/vrrp` (or null).
pub fn render(
    stats: &serde_json::Value,
    vips: &[VipRow],
    backends: &[BackendRow],
    vrrp: &serde_json::Value,
) -> String {
    let mut o = String::new();
    header(
        &mut o,
        "lb_xdp_packets_total",
        "counter",
        "Packets seen by the XDP program, by verdict or reason.",
    );
    if let Some(c) = stats.get("counters").and_then(|c| c.as_object()) {
        for (k, v) in c {
            let _ = writeln!(
                o,
                "lb_xdp_packets_total{{reason=\"{}\"}} {}",
                esc(k),
                v.as_u64().unwrap_or(0)
            );
        }
    }
    header(
        &mut o,
        "lb_conntrack_entries",
        "gauge",
        "Entries in the connection table.",
    );
    let _ = writeln!(
        o,
        "lb_conntrack_entries {}",
        stats["conntrack_entries"].as_u64().unwrap_or(0)
    );
    header(
        &mut o,
        "lb_conntrack_size",
        "gauge",
        "Capacity of the connection table.",
    );
    let _ = writeln!(
        o,
        "lb_conntrack_size {}",
        stats["conntrack_size"].as_u64().unwrap_or(0)
    );
    header(
        &mut o,
        "lb_new_connections_per_second",
        "gauge",
        "SYNs to owned VIPs per second (last 100 ms window, all CPUs): a SYN flood shows here.",
    );
    let _ = writeln!(
        o,
        "lb_new_connections_per_second {}",
        stats["syn_flood"]["new_connections_per_s"]
            .as_u64()
            .unwrap_or(0)
    );
    header(
        &mut o,
        "lb_syn_flood_mode",
        "gauge",
        "1 while SYN flood mode holds on some CPU (SYNs write no connection-table entry).",
    );
    let _ = writeln!(
        o,
        "lb_syn_flood_mode {}",
        u8::from(stats["syn_flood"]["active"] == true)
    );
    header(
        &mut o,
        "lb_config_reloads_total",
        "counter",
        "Config reloads, by result.",
    );
    let _ = writeln!(
        o,
        "lb_config_reloads_total{{result=\"ok\"}} {}",
        stats["reloads"].as_u64().unwrap_or(0)
    );
    let _ = writeln!(
        o,
        "lb_config_reloads_total{{result=\"refused\"}} {}",
        stats["reload_failures"].as_u64().unwrap_or(0)
    );

    header(
        &mut o,
        "lb_vip_owned",
        "gauge",
        "1 if this node forwards the VIP service.",
    );
    for v in vips {
        let _ = writeln!(
            o,
            "lb_vip_owned{{vip=\"{}\",address=\"{}\",port=\"{}\",protocol=\"{}\"}} {}",
            esc(&v.name),
            v.vip,
            v.port,
            v.protocol,
            v.owned as u8
        );
    }
    for (name, help, get) in [
        (
            "lb_vip_packets_total",
            "Packets forwarded for the VIP service.",
            (|v: &VipRow| v.packets) as fn(&VipRow) -> u64,
        ),
        (
            "lb_vip_bytes_total",
            "Bytes forwarded for the VIP service.",
            |v: &VipRow| v.bytes,
        ),
        (
            "lb_vip_new_flows_total",
            "New flows of the VIP service.",
            |v: &VipRow| v.new_flows,
        ),
    ] {
        header(&mut o, name, "counter", help);
        for v in vips {
            let _ = writeln!(
                o,
                "{name}{{vip=\"{}\",address=\"{}\",port=\"{}\",protocol=\"{}\"}} {}",
                esc(&v.name),
                v.vip,
                v.port,
                v.protocol,
                get(v)
            );
        }
    }
    header(
        &mut o,
        "lb_backend_up",
        "gauge",
        "1 if the backend receives new flows (active).",
    );
    for b in backends {
        let _ = writeln!(
            o,
            "lb_backend_up{{vip=\"{}\",port=\"{}\",backend=\"{}\",state=\"{}\"}} {}",
            esc(&b.vip_name),
            b.port,
            b.backend,
            b.state,
            (b.state == "active") as u8
        );
    }
    for (name, help, get) in [
        (
            "lb_backend_packets_total",
            "Packets sent to the backend.",
            (|b: &BackendRow| b.packets) as fn(&BackendRow) -> u64,
        ),
        (
            "lb_backend_bytes_total",
            "Bytes sent to the backend.",
            |b: &BackendRow| b.bytes,
        ),
        (
            "lb_backend_new_flows_total",
            "New flows sent to the backend.",
            |b: &BackendRow| b.new_flows,
        ),
    ] {
        header(&mut o, name, "counter", help);
        for b in backends {
            let _ = writeln!(
                o,
                "{name}{{vip=\"{}\",port=\"{}\",backend=\"{}\"}} {}",
                esc(&b.vip_name),
                b.port,
                b.backend,
                get(b)
            );
        }
    }
    if let Some(instances) = vrrp.as_array() {
        render_vrrp(&mut o, instances);
    }
    o
}

fn render_vrrp(o: &mut String, instances: &[serde_json::Value]) {
    let name = |i: &serde_json::Value| esc(i["name"].as_str().unwrap_or(""));
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    header(
        o,
        "lb_vrrp_state",
        "gauge",
        "1 for the instance's current state (initialize, backup, master, fault).",
    );
    for i in instances {
        let state = i["state"].as_str().unwrap_or("").to_lowercase();
        for s in ["initialize", "backup", "master", "fault"] {
            let _ = writeln!(
                o,
                "lb_vrrp_state{{instance=\"{}\",state=\"{s}\"}} {}",
                name(i),
                (state == s) as u8
            );
        }
    }
    header(
        o,
        "lb_vrrp_priority",
        "gauge",
        "Priority: base, and effective (with tracked weights).",
    );
    for i in instances {
        let _ = writeln!(
            o,
            "lb_vrrp_priority{{instance=\"{}\",kind=\"base\"}} {}",
            name(i),
            n(&i["base_priority"])
        );
        let _ = writeln!(
            o,
            "lb_vrrp_priority{{instance=\"{}\",kind=\"effective\"}} {}",
            name(i),
            n(&i["effective_priority"])
        );
    }
    for (metric, field, help) in [
        (
            "lb_vrrp_transitions_total",
            "transitions",
            "State transitions.",
        ),
        (
            "lb_vrrp_became_master_total",
            "became_master",
            "Transitions to master.",
        ),
        (
            "lb_vrrp_adverts_sent_total",
            "adverts_sent",
            "Adverts sent.",
        ),
        (
            "lb_vrrp_adverts_received_total",
            "adverts_received",
            "Valid adverts received.",
        ),
        (
            "lb_vrrp_split_brain_total",
            "split_brain",
            "Other masters seen while master.",
        ),
    ] {
        header(o, metric, "counter", help);
        for i in instances {
            let _ = writeln!(
                o,
                "{metric}{{instance=\"{}\"}} {}",
                name(i),
                n(&i["counters"][field])
            );
        }
    }
    header(
        o,
        "lb_vrrp_drops_total",
        "counter",
        "Adverts dropped, by reason.",
    );
    for i in instances {
        if let Some(d) = i["counters"]["drops"].as_object() {
            for (reason, v) in d {
                let _ = writeln!(
                    o,
                    "lb_vrrp_drops_total{{instance=\"{}\",reason=\"{}\"}} {}",
                    name(i),
                    esc(reason),
                    n(v)
                );
            }
        }
    }
    header(
        o,
        "lb_vrrp_collisions_total",
        "counter",
        "Adverts on our VRID whose VIP set or authentication differ from ours.",
    );
    for i in instances {
        let c = &i["collisions"];
        let total: u64 = c["peers"]
            .as_object()
            .map(|p| p.values().map(|x| n(&x["count"])).sum())
            .unwrap_or(0)
            + n(&c["untracked"]);
        let _ = writeln!(
            o,
            "lb_vrrp_collisions_total{{instance=\"{}\"}} {}",
            name(i),
            total
        );
    }
}
