//! lbctl: talks to lbd's API on its unix socket. It holds no logic of its own beyond formatting.
use std::{net::IpAddr, path::PathBuf};

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use hyper::Method;
use lb_userspace::api::{Client, DrainRequest};
use serde_json::Value;

#[derive(Parser)]
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
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
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
    /// Data-plane counters per verdict and reason, connection-table use.
    Stats,
    /// Make lbd re-read its config; an invalid config is refused and the running one kept.
    Reload,
    /// The API and ingress VRIDs OpenShift derives from a cluster name.
    VrIds {
        /// Cluster name (as in install-config's metadata.name).
        cluster_name: String,
    },
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand)]
enum BackendsCmd {
    /// List backends.
    List,
    /// Stop sending new flows to BACKEND of VIP; established flows continue.
    Drain { vip: String, backend: IpAddr },
    /// Undo a drain.
    Undrain { vip: String, backend: IpAddr },
}

#[derive(Subcommand)]
enum VipsCmd {
    /// List VIP services.
    List,
}

#[derive(Subcommand)]
enum VrrpCmd {
    /// Status of every VRRP instance.
    Status,
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
                "  last change  {} -> {} at {}: {}",
                s(t, "from"),
                s(t, "to"),
                s(t, "at_unix_ms"),
                s(t, "reason")
            );
        }
        let c = &i["counters"];
        println!(
            "  adverts      sent {} received {}; transitions {}; became master {}; split brain {}",
            s(c, "adverts_sent"),
            s(c, "adverts_received"),
            s(c, "transitions"),
            s(c, "became_master"),
            s(c, "split_brain")
        );
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
    let client = Client::new(&cli.socket);
    let json = cli.output == Output::Json;
    let print_json =
        |v: &Value| println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    match cli.command {
        Cmd::Backends(BackendsCmd::List) => {
            let v = client.call(Method::GET, "/v1/backends", None).await?;
            if json {
                print_json(&v);
            } else {
                let rows = v
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|b| {
                        vec![
                            s(b, "vip_name"),
                            s(b, "vip"),
                            format!("{}/{}", s(b, "port"), s(b, "protocol")),
                            s(b, "backend"),
                            s(b, "mac"),
                            s(b, "weight"),
                            s(b, "state"),
                            s(b, "packets"),
                            s(b, "bytes"),
                            s(b, "new_flows"),
                            s(b, "reason"),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "NAME", "VIP", "PORT", "BACKEND", "MAC", "WEIGHT", "STATE", "PACKETS",
                        "BYTES", "FLOWS", "REASON",
                    ],
                    rows,
                );
            }
        }
        Cmd::Backends(cmd @ (BackendsCmd::Drain { .. } | BackendsCmd::Undrain { .. })) => {
            let (path, vip, backend) = match cmd {
                BackendsCmd::Drain { vip, backend } => ("/v1/backends/drain", vip, backend),
                BackendsCmd::Undrain { vip, backend } => ("/v1/backends/undrain", vip, backend),
                BackendsCmd::List => unreachable!(),
            };
            let body = serde_json::to_string(&DrainRequest { vip, backend })?;
            let v = client.call(Method::POST, path, Some(body)).await?;
            if json {
                print_json(&v)
            } else {
                println!("{}", v)
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
                            format!("{}/{}", s(x, "port"), s(x, "protocol")),
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
                let f = &v["syn_flood"];
                println!(
                    "{:<20} {} new connections/s against {} entries (flood mode above {}/s per CPU: {})",
                    "syn_flood",
                    f["new_connections_per_s"],
                    f["conntrack_size"],
                    f["threshold_per_cpu"],
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
