//! The e2e bench's tables, verdicts and report (target/bench/report.md with SVG plots).
use serde_json::Value;

use super::{
    e2e::{Case, HOLD_CONNS},
    out_dir,
};

fn find<'a>(cases: &'a [Case], name: &str, conns: &str) -> &'a Case {
    cases
        .iter()
        .find(|c| c.name == name && c.conns == conns)
        .unwrap()
}

fn table_lines(cases: &[Case]) -> Vec<String> {
    let mut v = vec![
        format!(
            "| {:<8} | {:<5} | {:>9} | {:>8} | {:>8} | {:>12} | {:>14} | {:>14} | {:>6} |",
            "case",
            "conns",
            "req/s",
            "p50 ms",
            "p99 ms",
            "owner CPU s",
            "owner us/req",
            "extra us/req",
            "errors"
        ),
        format!(
            "|{}|",
            [10, 7, 11, 10, 10, 14, 16, 16, 8]
                .map(|n| "-".repeat(n))
                .join("|")
        ),
    ];
    for c in cases {
        v.push(format!(
            "| {:<8} | {:<5} | {:>9.0} | {:>8.2} | {:>8.2} | {:>12.3} | {:>14.2} | {:>14.2} | {:>6} |",
            c.name,
            c.conns,
            c.wrk.rps,
            c.wrk.p50_ms,
            c.wrk.p99_ms,
            c.owner_cpu_s,
            1e6 * c.owner_cpu_s / c.wrk.requests.max(1) as f64,
            1e6 * c.extra_cpu_s / c.wrk.requests.max(1) as f64,
            c.wrk.errors
        ));
    }
    v
}

/// The median over rounds of `a`'s req/s over `b`'s in the same round (the cases interleave
/// round by round, so each ratio compares runs seconds apart).
fn per_round(a: &Case, b: &Case) -> f64 {
    super::median(
        a.rounds
            .iter()
            .zip(&b.rounds)
            .map(|(x, y)| x.wrk.rps / y.wrk.rps.max(1e-9))
            .collect(),
    )
}

fn verdicts(cases: &[Case], lbd_pct: f64) -> Vec<String> {
    let mut v = Vec::new();
    for conns in ["short", "long"] {
        let (d, h, b) = (
            find(cases, "direct", conns),
            find(cases, "haproxy", conns),
            find(cases, "lbd", conns),
        );
        let vs_direct = b.wrk.rps / d.wrk.rps.max(1e-9);
        let vs_haproxy = b.wrk.rps / h.wrk.rps.max(1e-9);
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        v.push(format!(
            "{conns} connections: lbd = {vs_direct:.2}x direct (target >= 0.9: {}), \
             {vs_haproxy:.2}x haproxy (target >= 1.5: {}), p99 {:.2} vs haproxy {:.2} ms \
             (target no worse: {})",
            met(vs_direct >= 0.9),
            met(vs_haproxy >= 1.5),
            b.wrk.p99_ms,
            h.wrk.p99_ms,
            met(b.wrk.p99_ms <= h.wrk.p99_ms)
        ));
    }
    for conns in ["short", "long"] {
        let (d, f, f3, b) = (
            find(cases, "direct", conns),
            find(cases, "floor", conns),
            find(cases, "floor_3", conns),
            find(cases, "lbd", conns),
        );
        v.push(format!(
            "{conns} connections, medians of per-round ratios: the floor (a zero-cost L2 DSR \
             forwarder) = {:.2}x direct with one backend, {:.2}x with three; lbd = {:.2}x direct, \
             {:.2}x the three-backend floor",
            per_round(f, d),
            per_round(f3, d),
            per_round(b, d),
            per_round(b, f3)
        ));
    }
    v.push(format!(
        "survival: lbd {lbd_pct:.1} % (target >= 99 %: {})",
        if lbd_pct >= 99.0 { "met" } else { "NOT met" }
    ));
    v
}

pub(super) fn print_table(cases: &[Case], haproxy_pct: f64, lbd_pct: f64) {
    println!();
    for l in table_lines(cases) {
        println!("{l}");
    }
    println!(
        "connection survival when the owner dies: keepalived+haproxy {haproxy_pct:.1} %, lbd {lbd_pct:.1} %"
    );
    for v in verdicts(cases, lbd_pct) {
        println!("{v}");
    }
}

const COLORS: [&str; 3] = ["#7f7f7f", "#d62728", "#1f77b4"];

/// A grouped bar chart: one group per category, one bar per series.
fn bar_chart(title: &str, unit: &str, categories: &[&str], series: &[(&str, Vec<f64>)]) -> String {
    let (w, h) = (640.0, 360.0);
    let (left, right, top, bottom) = (70.0, 20.0, 40.0, 70.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    // A round axis maximum.
    let mag = 10f64.powf(max.log10().floor());
    let top_val = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * mag);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n",
        w / 2.0
    );
    for i in 0..=5 {
        let v = top_val * f64::from(i) / 5.0;
        let y = top + plot_h - plot_h * f64::from(i) / 5.0;
        s += &format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            w - right,
            left - 6.0,
            y + 4.0,
            fmt_num(v)
        );
    }
    s += &format!(
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">{unit}</text>\n",
        top + plot_h / 2.0,
        top + plot_h / 2.0
    );
    let group_w = plot_w / categories.len() as f64;
    let bar_w = group_w * 0.8 / series.len() as f64;
    for (ci, cat) in categories.iter().enumerate() {
        let gx = left + group_w * ci as f64 + group_w * 0.1;
        for (si, (_, vals)) in series.iter().enumerate() {
            let v = vals.get(ci).copied().unwrap_or(0.0);
            let bh = plot_h * v / top_val;
            let x = gx + bar_w * si as f64;
            let y = top + plot_h - bh;
            s += &format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>\n",
                bar_w - 2.0,
                COLORS[si % COLORS.len()],
                x + bar_w / 2.0 - 1.0,
                y - 3.0,
                fmt_num(v)
            );
        }
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{cat}</text>\n",
            gx + group_w * 0.4,
            top + plot_h + 16.0
        );
    }
    s += &format!(
        "<line x1=\"{left}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"black\"/>\n",
        top + plot_h,
        w - right
    );
    for (si, (name, _)) in series.iter().enumerate() {
        let x = left + 230.0 * si as f64;
        let y = h - 22.0;
        s += &format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{y:.1}\">{name}</text>\n",
            y - 10.0,
            COLORS[si % COLORS.len()],
            x + 16.0
        );
    }
    s += "</svg>\n";
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub(super) fn write_report(cases: &[Case], haproxy_pct: f64, lbd_pct: f64, doc: &Value) {
    let dir = out_dir();
    let names = ["direct", "haproxy", "lbd"];
    let per = |f: fn(&Case) -> f64, conns: &str| -> Vec<f64> {
        names.iter().map(|n| f(find(cases, n, conns))).collect()
    };
    let rps = bar_chart(
        "Throughput (wrk, same load)",
        "requests / s",
        &["short connections", "keep-alive"],
        &names
            .iter()
            .map(|n| {
                (
                    *n,
                    vec![
                        find(cases, n, "short").wrk.rps,
                        find(cases, n, "long").wrk.rps,
                    ],
                )
            })
            .collect::<Vec<_>>(),
    );
    let lat_cats = [
        "direct short",
        "haproxy short",
        "lbd short",
        "direct long",
        "haproxy long",
        "lbd long",
    ];
    let mut p50 = per(|c| c.wrk.p50_ms, "short");
    p50.extend(per(|c| c.wrk.p50_ms, "long"));
    let mut p99 = per(|c| c.wrk.p99_ms, "short");
    p99.extend(per(|c| c.wrk.p99_ms, "long"));
    let lat = bar_chart("Latency", "ms", &lat_cats, &[("p50", p50), ("p99", p99)]);
    let surv = bar_chart(
        &format!("{HOLD_CONNS} long-lived connections surviving the owner's death"),
        "% surviving",
        &["keepalived + haproxy", "lbd"],
        &[("survived %", vec![haproxy_pct, lbd_pct])],
    );
    let cpu_cats = ["haproxy short", "lbd short", "haproxy long", "lbd long"];
    let us = |f: fn(&Case) -> f64| -> Vec<f64> {
        [
            ("haproxy", "short"),
            ("lbd", "short"),
            ("haproxy", "long"),
            ("lbd", "long"),
        ]
        .iter()
        .map(|(n, c)| {
            let c = find(cases, n, c);
            1e6 * f(c) / c.wrk.requests.max(1) as f64
        })
        .collect()
    };
    let cpu = bar_chart(
        "CPU per request for the VIP",
        "microseconds / request",
        &cpu_cats,
        &[
            ("owner (haproxy proc / XDP prog)", us(|c| c.owner_cpu_s)),
            ("whole machine vs direct", us(|c| c.extra_cpu_s)),
        ],
    );
    for (name, svg) in [
        ("e2e-cpu.svg", &cpu),
        ("e2e-throughput.svg", &rps),
        ("e2e-latency.svg", &lat),
        ("e2e-survival.svg", &surv),
    ] {
        std::fs::write(dir.join(name), svg).unwrap();
    }
    let mut md = String::from("# lb end-to-end benchmark (`cargo xtask bench e2e`)\n\n");
    md += "One lab of network namespaces on one bridge (2-core machine, shared with other \
           work): a client running `wrk`, three keepalived+haproxy nodes, three lbd nodes and \
           three backends (`standin http`), all separate namespaces.\n\n";
    md += &format!("Load: {}\n\n", doc["method"]["load"].as_str().unwrap_or(""));
    for l in table_lines(cases) {
        md += &l;
        md += "\n";
    }
    md += "\n- owner CPU s (total over the rounds) and owner us/req: ";
    md += doc["method"]["owner_cpu_s"].as_str().unwrap_or("");
    md += "\n- extra us/req: whole-machine busy CPU (user+nice+system+irq+softirq+steal from \
           /proc/stat, including any other work on the machine) per request of the case minus \
           that of the direct case: an upper bound of what the VIP path costs, extra hops \
           included. The lbd owner figure is the XDP program alone; generic (skb) mode's \
           per-packet skb work on the owner shows only in this column. It can go negative when \
           the VIP case spreads load over three backends better than one backend handles it.";
    md += "\n\n";
    if let Some(rows) = doc["owner_cpu_like_for_like"].as_array()
        && !rows.is_empty()
    {
        md += "### Owner CPU per request, like for like\n\n";
        md += doc["method"]["owner_cpu_like_for_like"]
            .as_str()
            .unwrap_or("");
        md += "\n\n| case | conns | req/s | process s | receive thread s | owner us/request |\n|---|---|---|---|---|---|\n";
        for r in rows {
            md += &format!(
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} |\n",
                r["name"].as_str().unwrap_or(""),
                r["connections"].as_str().unwrap_or(""),
                r["rps"].as_f64().unwrap_or(0.0),
                r["process_cpu_s"].as_f64().unwrap_or(0.0),
                r["receive_thread_cpu_s"].as_f64().unwrap_or(0.0),
                r["owner_cpu_us_per_req"].as_f64().unwrap_or(0.0),
            );
        }
        md += "\n";
    }
    for v in verdicts(cases, lbd_pct) {
        md += &format!("- {v}\n");
    }
    md += &format!(
        "\n## Connection survival\n\n{}\n\n| | surviving |\n|---|---|\n| keepalived + haproxy | {haproxy_pct:.1} % |\n| lbd | {lbd_pct:.1} % |\n\n",
        doc["method"]["survival"].as_str().unwrap_or("")
    );
    md += &format!(
        "## Notes\n\n\
         - XDP mode: {}. `LB_E2E_XDP_MODE=native` runs lbd in driver mode with `lb_pass` on the \
         bridge-side veth peers; it needs the client's TX checksum offload off (native XDP on a \
         veth loses a pending CHECKSUM_PARTIAL, so XDP_TX would forward segments with unfinished \
         checksums), and on veths it was not faster than generic mode.\n\
         - `direct` is one backend; the VIP cases spread the load over three, so on a 2-core \
         machine where client and backends share the CPUs, `direct` is not a strict upper bound.\n\
         - The machine is shared with other work (another helper's VRRP labs ran at the same \
         time): the whole-machine figures include it; rounds interleave the cases so drift \
         hits all of them alike. p99 on this machine is dominated by scheduling (2 cores, more \
         runnable threads than cores).\n\
         - keepalived+haproxy: the new owner's haproxy has no state for the old connections; \
         a connection either times out (no answer while the VIP moves, ~3.5 s with \
         advert_int 1) or is reset by the new owner. With lbd the new owner's Maglev table \
         sends each flow to the same backend, and the backend answers the client directly.\n\n",
        doc["method"]["xdp_mode"].as_str().unwrap_or("")
    );
    md += "![throughput](e2e-throughput.svg)\n\n![latency](e2e-latency.svg)\n\n![survival](e2e-survival.svg)\n\n![cpu](e2e-cpu.svg)\n";
    let path = dir.join("report.md");
    std::fs::write(&path, md).unwrap();
    println!("wrote {}", path.display());
}
