//! `lbctl trace [VIP[:PORT]] [--count N] [--wait DURATION]`: a live sample of the data plane's
//! decisions (the XDP program writes them to a ring buffer only while a trace is attached).

use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, anyhow};
use lb_userspace::{
    explain::TraceQuery,
    status::{TracesRow, VipRow},
};

use crate::{Ctx, output::table};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Only this VIP: a name or address, or VIP:PORT ([v6]:PORT for IPv6).
    vip: Option<String>,
    /// Stop after this many decisions.
    #[arg(long, default_value_t = 20)]
    count: usize,
    /// Stop after this long even with fewer decisions (up to 60s).
    #[arg(long, default_value = "10s", value_parser = crate::output::parse_duration)]
    pub wait: std::time::Duration,
}

pub async fn run(ctx: &Ctx, a: Args) -> Result<()> {
    let mut q = TraceQuery {
        count: a.count,
        wait_ms: a.wait.as_millis() as u64,
        ..Default::default()
    };
    if let Some(v) = &a.vip {
        if let Ok(ip) = v.parse::<IpAddr>() {
            q.vip = Some(ip);
        } else if let Ok(s) = v.parse::<SocketAddr>() {
            q.vip = Some(s.ip());
            q.port = Some(s.port());
        } else {
            let (name, port) = match v.rsplit_once(':') {
                Some((n, p)) => (
                    n,
                    Some(p.parse().map_err(|_| anyhow!("{v}: {p:?} is not a port"))?),
                ),
                None => (v.as_str(), None),
            };
            let vips: Vec<VipRow> = ctx.client.get("/v1/vips").await?;
            let row = vips
                .iter()
                .find(|r| r.name == name)
                .ok_or_else(|| anyhow!("{name}: no such VIP (lbctl vips list)"))?;
            q.vip = Some(row.vip);
            q.port = port;
        }
    }
    let r: TracesRow = ctx.client.get(&format!("/v1/trace?{}", q.query())).await?;
    let wide = ctx.out.wide();
    ctx.show(&r, |r| {
        let mut headers = vec![
            "CLIENT",
            "VIP",
            "PROTO",
            "VERDICT",
            "REASON",
            "CONNTRACK",
            "BACKEND",
        ];
        if wide {
            headers.extend(["ENTRY", "SLOT", "SLOT BACKEND", "SKIPPED"]);
        }
        let rows = r
            .decisions
            .iter()
            .map(|x| {
                let opt = |a: Option<IpAddr>| a.map_or("-".into(), |a| a.to_string());
                let mut row = vec![
                    SocketAddr::new(x.client, x.client_port).to_string(),
                    SocketAddr::new(x.vip, x.port).to_string(),
                    x.protocol.clone(),
                    x.verdict.clone(),
                    x.reason.clone(),
                    x.conntrack.clone().unwrap_or("-".into()),
                    opt(x.backend),
                ];
                if wide {
                    row.extend([
                        x.entry.clone().unwrap_or("-".into()),
                        x.slot.map_or("-".into(), |s| s.to_string()),
                        opt(x.slot_backend),
                        if x.skipped { "yes" } else { "no" }.into(),
                    ]);
                }
                row
            })
            .collect();
        table(&headers, rows);
        println!(
            "{} decisions{}{}",
            r.decisions.len(),
            if r.filtered > 0 {
                format!(", {} of other VIPs left out", r.filtered)
            } else {
                String::new()
            },
            if r.timed_out {
                " (the wait ended first)"
            } else {
                ""
            }
        );
    })
}
