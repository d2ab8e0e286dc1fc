//! lbctl: talks to lbd's API on its unix socket. It holds no logic of its own beyond formatting.
use std::{net::IpAddr, path::PathBuf};

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use hyper::Method;
use lb_userspace::api::{Client, DrainRequest};
use serde_json::Value;

#[derive(Parser, Clone)]
#[command(
    name = "lbctl",
    version,
    about = "Inspect and steer lbd, the XDP load balancer"
)]
struct Cli {
    /// lbd's API socket.
    #[arg(
        long,
        global = true,
        env = "LBD_SOCKET",
        default_value = "/run/lbd/lbd.sock"
    )]
    socket: PathBuf,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value = "table")]
    output: Output,
    /// Run the command again every interval (default 2s) until interrupted, like watch(1).
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "2s", value_parser = parse_duration)]
    watch: Option<std::time::Duration>,
    /// Give up when lbd does not answer within this time (e.g. 500ms, 5s).
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    timeout: std::time::Duration,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Clone)]
enum Cmd {
    /// Backends per VIP service: state, MAC, weight, traffic.
    #[command(subcommand)]
    Backends(BackendsCmd),
    /// VIP services: ownership and traffic.
    #[command(subcommand)]
    Vips(VipsCmd),
    /// VRRP instances: state, priorities, master, counters, collisions.
    #[command(subcommand)]
    Vrrp(VrrpCmd),
    /// BGP announcements (VIPs with announce = "bgp"): sessions, prefixes, node drain.
    #[command(subcommand)]
    Bgp(BgpCmd),
    /// Data-plane counters per verdict and reason, connection-table use.
    Stats,
    /// Make lbd re-read its config; an invalid config is refused and the running one kept.
    Reload,
    /// The API and ingress VRIDs OpenShift derives from a cluster name.
    VrIds {
        /// Cluster name (as in install-config's metadata.name).
        cluster_name: String,
    },
    /// Write every node's lbd.toml (DIR/<node>.toml) from one cluster description: OpenShift's
    /// VRIDs, priorities and tracked checks, unicast peers. Validated like lbd's config; nothing
    /// is written unless every node's config is valid. No lbd needed.
    Render {
        /// The cluster description (TOML); see docs/rendering.md.
        #[arg(long)]
        cluster: PathBuf,
        /// Output directory (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Also write MachineConfigs (99-<pool>-lb.yaml) shipping every node's config and the
        /// static pod, whose image is this reference (by digest, e.g. from `cargo xtask image`).
        #[arg(long)]
        image: Option<String>,
    },
    /// Exit 0 if lbd is live (main loop running) or ready (data plane attached, config
    /// applied), else 1: for the pod's probes.
    Probe {
        #[arg(value_enum)]
        what: ProbeKind,
    },
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
}

#[derive(Clone, Copy, ValueEnum)]
enum ProbeKind {
    Live,
    Ready,
}

/// A static pod manifest with its `image:` set to `image`.
fn with_image(manifest: &str, image: &str) -> String {
    manifest
        .lines()
        .map(|l| match l.split_once("image: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}image: {image}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// "500ms", "5s", "2m", or plain seconds.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: want a duration like 500ms, 5s or 1m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    if !(secs > 0.0 && secs < 86_400.0) {
        return Err(format!("{s:?}: must be above 0 and below a day"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[derive(Subcommand, Clone)]
enum BackendsCmd {
    /// List backends.
    List,
    /// Stop sending new flows to BACKEND of VIP; established flows continue.
    Drain { vip: String, backend: IpAddr },
    /// Undo a drain.
    Undrain { vip: String, backend: IpAddr },
}

#[derive(Subcommand, Clone)]
enum VipsCmd {
    /// List VIP services.
    List,
}

#[derive(Subcommand, Clone)]
enum BgpCmd {
    /// Sessions (BGP and BFD), announced prefixes and why a prefix is withdrawn.
    Status,
    /// Withdraw every prefix of this node: the routers stop sending it new flows, and flows
    /// already here continue through the other nodes.
    Drain,
    /// Announce again what is ready.
    Undrain,
}

#[derive(Subcommand, Clone)]
enum VrrpCmd {
    /// Status of every VRRP instance.
    Status,
}

/// A past instant (unix ms) as "3.2s ago", "4m12s ago", "2h03m ago"; "-" when absent.
fn ago(unix_ms: Option<u64>) -> String {
    let Some(t) = unix_ms else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let ms = now.saturating_sub(t);
    match ms {
        0..=59_999 => format!("{:.1}s ago", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s ago", ms / 60_000, ms / 1000 % 60),
        3_600_000..=172_799_999 => format!("{}h{:02}m ago", ms / 3_600_000, ms / 60_000 % 60),
        _ => format!("{}d ago", ms / 86_400_000),
    }
}

/// A service port: `*` for every port.
fn port(v: &Value) -> String {
    match v["port"].as_u64() {
        Some(0) => "*".into(),
        Some(p) => p.to_string(),
        None => "-".into(),
    }
}

fn s(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// Print rows as an aligned table.
fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<w$}", c, w = widths[i]))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
}

/// `lbctl backends list` as a table: state, traffic and the last health check.
fn backends_table(v: &Value) {
    let rows = v
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|b| {
            let c = &b["check"];
            let (check, took, when) = if c.is_null() {
                ("not checked".to_string(), "-".to_string(), "-".to_string())
            } else {
                let result = match c["result"].as_str() {
                    Some("") | None => "pending".to_string(),
                    Some(r) => r.to_string(),
                };
                let took = c["duration_ms"]
                    .as_u64()
                    .map(|d| format!("{d}ms"))
                    .unwrap_or_else(|| "-".into());
                (result, took, ago(c["at_unix_ms"].as_u64()))
            };
            vec![
                s(b, "vip_name"),
                s(b, "vip"),
                format!("{}/{}", port(b), s(b, "protocol")),
                s(b, "backend"),
                s(b, "mac"),
                s(b, "weight"),
                s(b, "state"),
                s(b, "packets"),
                s(b, "bytes"),
                s(b, "new_flows"),
                check,
                took,
                when,
                s(b, "reason"),
            ]
        })
        .collect();
    table(
        &[
            "NAME", "VIP", "PORT", "BACKEND", "MAC", "WEIGHT", "STATE", "PACKETS", "BYTES",
            "FLOWS", "CHECK", "TOOK", "CHECKED", "REASON",
        ],
        rows,
    );
}

/// `lbctl vrrp status` as text: one block per instance.
fn vrrp_table(v: &Value) {
    let list = v.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no VRRP instances");
    }
    for i in list {
        println!(
            "{} (VRID {}, VRRPv{}, {}): {}",
            s(&i, "name"),
            s(&i, "vrid"),
            s(&i, "version"),
            s(&i, "interface"),
            s(&i, "state").to_uppercase()
        );
        println!(
            "  priority     base {} effective {} (tracked {:+})",
            s(&i, "base_priority"),
            s(&i, "effective_priority"),
            i["track_weight"].as_i64().unwrap_or(0)
        );
        println!(
            "  master       {}   (we are {})",
            s(&i, "master"),
            s(&i, "primary_addr")
        );
        println!(
            "  interval     {} ms (master advertises {} ms)",
            s(&i, "advert_interval_ms"),
            s(&i, "master_advert_interval_ms")
        );
        let vips: Vec<String> = i["vips"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|x| x.as_str().unwrap_or("").to_string())
            .collect();
        println!(
            "  vips         {} (owned here: {})",
            vips.join(", "),
            s(&i, "owned")
        );
        if let Some(t) = i.get("last_transition").filter(|t| !t.is_null()) {
            println!(
                "  last change  {} -> {} {}: {}",
                s(t, "from"),
                s(t, "to"),
                ago(t["at_unix_ms"].as_u64()),
                s(t, "reason")
            );
        }
        let c = &i["counters"];
        println!(
            "  adverts      sent {} received {} send errors {}; transitions {}; became master {}; split brain {}",
            s(c, "adverts_sent"),
            s(c, "adverts_received"),
            s(c, "send_errors"),
            s(c, "transitions"),
            s(c, "became_master"),
            s(c, "split_brain")
        );
        if let Some(e) = i.get("last_send_error").filter(|e| !e.is_null()) {
            println!(
                "  send error   {} to {}: {}",
                ago(e["at_unix_ms"].as_u64()),
                s(e, "dst"),
                s(e, "error")
            );
        }
        let drops: Vec<String> = c["drops"]
            .as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "  drops        {}",
            if drops.is_empty() {
                "none".into()
            } else {
                drops.join(", ")
            }
        );
        let col = &i["collisions"];
        let peers: Vec<String> = col["peers"]
            .as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|(peer, c)| {
                format!(
                    "{peer}: {} adverts, differs: {}",
                    s(&c, "count"),
                    c["differs"]
                )
            })
            .collect();
        println!(
            "  collisions   {}",
            if peers.is_empty() {
                "none".to_string()
            } else {
                peers.join("; ")
            }
        );
        for t in i["tracks"].as_array().cloned().unwrap_or_default() {
            let state = if t["passing"].as_bool() == Some(true) {
                "passing"
            } else {
                "failing"
            };
            println!(
                "  track        {} ({}): {:+} {}",
                s(&t, "name"),
                s(&t, "check"),
                t["weight"].as_i64().unwrap_or(0),
                state
            );
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let Some(every) = cli.watch else {
        return run_once(cli).await;
    };
    loop {
        // Clear the screen and home the cursor, then a header like watch(1).
        print!("\x1b[H\x1b[2J");
        println!(
            "every {every:?}: lbctl {}\n",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        if let Err(e) = run_once(cli.clone()).await {
            println!("lbctl: {e:#}");
        }
        tokio::time::sleep(every).await;
    }
}

async fn run_once(cli: Cli) -> Result<()> {
    let client = Client::new(&cli.socket).with_timeout(cli.timeout);
    let json = cli.output == Output::Json;
    let print_json =
        |v: &Value| println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    match cli.command {
        Cmd::Backends(BackendsCmd::List) => {
            let v = client.call(Method::GET, "/v1/backends", None).await?;
            if json {
                print_json(&v);
            } else {
                backends_table(&v);
            }
        }
        Cmd::Backends(cmd @ (BackendsCmd::Drain { .. } | BackendsCmd::Undrain { .. })) => {
            let (path, vip, backend) = match cmd {
                BackendsCmd::Drain { vip, backend } => ("/v1/backends/drain", vip, backend),
                BackendsCmd::Undrain { vip, backend } => ("/v1/backends/undrain", vip, backend),
                BackendsCmd::List => unreachable!(),
            };
            let body = serde_json::to_string(&DrainRequest {
                vip: vip.clone(),
                backend,
            })?;
            let v = client.call(Method::POST, path, Some(body)).await?;
            if json {
                print_json(&v)
            } else {
                // The backend's rows as they are now, so the operator sees the effect.
                let all = client.call(Method::GET, "/v1/backends", None).await?;
                let rows: Vec<Value> = all
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|b| {
                        (b["vip_name"] == vip.as_str() || b["vip"] == vip.as_str())
                            && b["backend"] == backend.to_string().as_str()
                    })
                    .collect();
                backends_table(&Value::Array(rows));
            }
        }
        Cmd::Vips(VipsCmd::List) => {
            let v = client.call(Method::GET, "/v1/vips", None).await?;
            if json {
                print_json(&v);
            } else {
                let rows = v
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|x| {
                        vec![
                            s(x, "name"),
                            s(x, "vip"),
                            format!("{}/{}", port(x), s(x, "protocol")),
                            if x["owned"].as_bool() == Some(true) {
                                "yes".into()
                            } else {
                                "no".into()
                            },
                            s(x, "vrrp"),
                            format!("{}/{}", s(x, "backends_active"), s(x, "backends_total")),
                            s(x, "packets"),
                            s(x, "bytes"),
                            s(x, "new_flows"),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "NAME", "VIP", "PORT", "OWNED", "VRRP", "ACTIVE", "PACKETS", "BYTES",
                        "FLOWS",
                    ],
                    rows,
                );
            }
        }
        Cmd::Vrrp(VrrpCmd::Status) => {
            let v = client.call(Method::GET, "/v1/vrrp", None).await?;
            if json {
                print_json(&v);
            } else {
                vrrp_table(&v);
            }
        }
        Cmd::Bgp(cmd) => {
            let v = match cmd {
                BgpCmd::Status => client.call(Method::GET, "/v1/bgp", None).await?,
                BgpCmd::Drain => client.call(Method::POST, "/v1/bgp/drain", None).await?,
                BgpCmd::Undrain => client.call(Method::POST, "/v1/bgp/undrain", None).await?,
            };
            if json {
                print_json(&v);
            } else if v.get("prefixes").is_some() {
                print!("{}", lb_userspace::bgp::status_text(&v));
            } else {
                println!("{v}");
            }
        }
        Cmd::Stats => {
            let v = client.call(Method::GET, "/v1/stats", None).await?;
            if json {
                print_json(&v);
            } else {
                for k in [
                    "interface",
                    "uptime_s",
                    "conntrack_entries",
                    "conntrack_size",
                    "table_size",
                    "reloads",
                    "reload_failures",
                    "last_reload_error",
                ] {
                    println!("{k:<20} {}", s(&v, k));
                }
                print!(
                    "{}",
                    lb_userspace::sync::status::text(
                        &v["sync"],
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64)
                    )
                );
                let f = &v["syn_flood"];
                println!(
                    "{:<20} {} new connections/s against {} entries (flood mode above {}/s: {})",
                    "syn_flood",
                    f["new_connections_per_s"],
                    f["conntrack_size"],
                    f["threshold_per_s"],
                    if f["active"] == true { "ON" } else { "off" }
                );
                println!();
                let rows = v["counters"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, c)| vec![k, c.to_string()])
                    .collect();
                table(&["COUNTER", "PACKETS"], rows);
            }
        }
        Cmd::Reload => {
            let v = client.call(Method::POST, "/v1/reload", None).await?;
            if json {
                print_json(&v)
            } else {
                println!("reloaded")
            }
        }
        Cmd::VrIds { cluster_name } => {
            let (api, ingress) = lb_userspace::vrrp::vrids::openshift_vrids(&cluster_name);
            if json {
                print_json(
                    &serde_json::json!({"cluster": cluster_name, "api_vrid": api, "ingress_vrid": ingress}),
                );
            } else {
                println!("cluster {cluster_name}: api VRID {api}, ingress VRID {ingress}");
            }
        }
        Cmd::Render {
            cluster,
            out,
            image,
        } => {
            use lb_userspace::render::{ClusterSpec, to_toml};
            let spec = ClusterSpec::load(&cluster)
                .map_err(|e| anyhow::anyhow!("{}: {e}", cluster.display()))?;
            let rendered = spec
                .render()
                .map_err(|e| anyhow::anyhow!("{}: {e}", cluster.display()))?;
            std::fs::create_dir_all(&out)
                .map_err(|e| anyhow::anyhow!("create {}: {e}", out.display()))?;
            let (api, ingress) = spec.vrids();
            let mut rows = Vec::new();
            for r in &rendered {
                let path = out.join(format!("{}.toml", r.node));
                std::fs::write(&path, to_toml(&spec.name, r))
                    .map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
                rows.push(serde_json::json!({
                    "node": r.node,
                    "path": path,
                    "vips": r.config.vips.iter().map(|v| v.name.clone()).collect::<Vec<_>>(),
                }));
            }
            let mut machine_configs = Vec::new();
            if let Some(image) = image {
                for pool in ["master", "worker"] {
                    let members: Vec<_> = spec
                        .nodes
                        .iter()
                        .zip(&rendered)
                        .filter(|(n, _)| lb_userspace::render::pool(n) == pool)
                        .collect();
                    if members.is_empty() {
                        continue;
                    }
                    let pod = if pool == "master" {
                        include_str!("../../../deploy/lb-control-plane.yaml")
                    } else {
                        include_str!("../../../deploy/lb-worker.yaml")
                    };
                    let pod = with_image(pod, &image);
                    let mut files: Vec<(String, String, u32)> = members
                        .iter()
                        .map(|(n, r)| {
                            (
                                format!(
                                    "{}/{}.toml",
                                    lb_userspace::render::NODE_CONFIG_DIR,
                                    n.name
                                ),
                                to_toml(&spec.name, r),
                                0o600,
                            )
                        })
                        .collect();
                    files.push((lb_userspace::render::STATIC_POD_PATH.into(), pod, 0o644));
                    let path = out.join(format!("99-{pool}-lb.yaml"));
                    std::fs::write(&path, lb_userspace::render::machine_config(pool, &files))
                        .map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
                    machine_configs.push(path);
                }
            }
            if json {
                print_json(&serde_json::json!({
                    "cluster": spec.name, "api_vrid": api, "ingress_vrid": ingress, "nodes": rows,
                    "machine_configs": machine_configs,
                }));
            } else {
                println!(
                    "cluster {}: api VRID {api}, ingress VRID {ingress}",
                    spec.name
                );
                table(
                    &["NODE", "VIPS", "CONFIG"],
                    rows.iter()
                        .map(|r| {
                            let vips: Vec<&str> = r["vips"]
                                .as_array()
                                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                                .unwrap_or_default();
                            vec![s(r, "node"), vips.join(","), s(r, "path")]
                        })
                        .collect(),
                );
                for p in machine_configs {
                    println!("machine config: {}", p.display());
                }
            }
        }
        Cmd::Probe { what } => {
            let path = match what {
                ProbeKind::Live => "/healthz",
                ProbeKind::Ready => "/readyz",
            };
            let v = client.call(Method::GET, path, None).await?;
            print!("{}", v.as_str().unwrap_or_default());
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "lbctl", &mut std::io::stdout());
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lbctl: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lbctl: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_ago() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert_eq!(ago(Some(now - 3_200)), "3.2s ago");
        assert_eq!(ago(Some(now - 252_000)), "4m12s ago");
        assert_eq!(ago(Some(now - 7_380_000)), "2h03m ago");
        assert_eq!(ago(None), "-");
    }

    #[test]
    fn all_ports_show_as_a_star() {
        assert_eq!(port(&serde_json::json!({"port": 0})), "*");
        assert_eq!(port(&serde_json::json!({"port": 443})), "443");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("5s").unwrap().as_secs(), 5);
        assert_eq!(parse_duration("2").unwrap().as_secs(), 2);
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5h").is_err());
    }
}
