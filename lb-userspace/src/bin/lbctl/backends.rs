//! `lbctl backends`: list (optionally one VIP's), drain, undrain.

use std::net::IpAddr;

use anyhow::Result;
use clap::Subcommand;
use lb_userspace::{api::DrainRequest, status::BackendRow};

use crate::{
    Ctx,
    output::{ago, table},
};

#[derive(Subcommand, Clone)]
pub enum Cmd {
    /// List backends, of every VIP or of VIP (name or address).
    List { vip: Option<String> },
    /// Stop sending new flows to BACKEND of VIP; established flows continue.
    Drain { vip: String, backend: IpAddr },
    /// Undo a drain.
    Undrain { vip: String, backend: IpAddr },
}

pub async fn run(ctx: &Ctx, cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::List { vip } => {
            let mut rows: Vec<BackendRow> = ctx.client.get("/v1/backends").await?;
            if let Some(vip) = &vip {
                rows.retain(|r| r.of_vip(vip));
            }
            ctx.show(&rows, |rows| print(rows, ctx.out.wide()))
        }
        Cmd::Drain { vip, backend } => drain(ctx, "/v1/backends/drain", vip, backend).await,
        Cmd::Undrain { vip, backend } => drain(ctx, "/v1/backends/undrain", vip, backend).await,
    }
}

async fn drain(ctx: &Ctx, path: &str, vip: String, backend: IpAddr) -> Result<()> {
    let body = serde_json::to_string(&DrainRequest {
        vip: vip.clone(),
        backend,
    })?;
    let answer: serde_json::Value = ctx.client.post(path, Some(body)).await?;
    if ctx.out.structured() {
        return crate::output::document(ctx.out, &answer);
    }
    // The backend's rows as they are now, so the operator sees the effect.
    let mut rows: Vec<BackendRow> = ctx.client.get("/v1/backends").await?;
    rows.retain(|r| r.of_vip(&vip) && r.backend == backend);
    print(&rows, ctx.out.wide());
    Ok(())
}

/// The last check: result, duration, when.
fn check(b: &BackendRow) -> (String, String, String) {
    match &b.check {
        None => ("not checked".into(), "-".into(), "-".into()),
        Some(c) => (
            if c.result.is_empty() {
                "pending".into()
            } else {
                c.result.clone()
            },
            c.duration_ms
                .map(|d| format!("{d}ms"))
                .unwrap_or_else(|| "-".into()),
            ago(c.at_unix_ms),
        ),
    }
}

/// The table: state and the last health check; `wide` adds MAC, weight and traffic.
pub fn print(rows: &[BackendRow], wide: bool) {
    let mut headers = vec![
        "NAME", "VIP", "PORT", "BACKEND", "STATE", "CHECK", "CHECKED",
    ];
    if wide {
        headers.extend([
            "MAC", "WEIGHT", "PACKETS", "BYTES", "FLOWS", "TOOK", "CHECKS", "FAILED",
        ]);
    }
    headers.push("REASON");
    let rows = rows
        .iter()
        .map(|b| {
            let (result, took, when) = check(b);
            let mut r = vec![
                b.vip_name.clone(),
                b.vip.to_string(),
                format!("{}/{}", b.port_label(), b.protocol),
                b.backend.to_string(),
                b.state.clone(),
                result,
                when,
            ];
            if wide {
                r.extend([
                    b.mac.clone(),
                    b.weight.to_string(),
                    b.packets.to_string(),
                    b.bytes.to_string(),
                    b.new_flows.to_string(),
                    took,
                    b.check
                        .as_ref()
                        .map_or("-".into(), |c| c.checks_run.to_string()),
                    b.check
                        .as_ref()
                        .map_or("-".into(), |c| c.checks_failed.to_string()),
                ]);
            }
            r.push(b.reason.clone());
            r
        })
        .collect();
    table(&headers, rows);
}
