//! `lbctl flows [VIP[:PORT]] [--client ADDR[:PORT]] [--limit N]`: connection-table and
//! flow-cache entries, read from the maps while forwarding goes on.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, anyhow};
use lb_userspace::{
    api::FlowFilter,
    status::{FlowsRow, VipRow},
};

use crate::{
    Ctx,
    output::{self, table},
};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// A VIP (name or address), or VIP:PORT ([v6]:PORT for IPv6).
    vip: Option<String>,
    /// Only this client: ADDR or ADDR:PORT ([v6]:PORT).
    #[arg(long)]
    client: Option<String>,
    /// At most this many entries from each table.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// ADDR or ADDR:PORT; `None` port when absent.
fn addr_port(s: &str) -> Option<(IpAddr, Option<u16>)> {
    if let Ok(a) = s.parse::<IpAddr>() {
        return Some((a, None));
    }
    s.parse::<SocketAddr>()
        .ok()
        .map(|a| (a.ip(), Some(a.port())))
}

pub async fn run(ctx: &Ctx, a: Args) -> Result<()> {
    let mut f = FlowFilter {
        limit: a.limit,
        ..Default::default()
    };
    if let Some(v) = &a.vip {
        let (addr, port) = match addr_port(v) {
            Some(x) => x,
            None => {
                // A name, maybe with :PORT.
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
                (row.vip, port)
            }
        };
        f.vip = Some(addr);
        f.port = port;
    }
    if let Some(c) = &a.client {
        let (addr, port) =
            addr_port(c).ok_or_else(|| anyhow!("--client {c}: want ADDR or ADDR:PORT"))?;
        f.client = Some(addr);
        f.client_port = port;
    }
    let rows: FlowsRow = ctx.client.get(&format!("/v1/flows?{}", f.query())).await?;
    ctx.show(&rows, |r| {
        table(
            &[
                "TABLE", "CLIENT", "VIP", "PROTO", "BACKEND", "ID", "EPOCH", "STATE",
            ],
            r.flows
                .iter()
                .map(|x| {
                    let sock = |a: IpAddr, p: u16| SocketAddr::new(a, p).to_string();
                    vec![
                        x.table.clone(),
                        sock(x.client, x.client_port),
                        output::with_name(sock(x.vip, x.port), &x.vip_name),
                        x.protocol.clone(),
                        x.backend.map_or("-".into(), |b| b.to_string()),
                        x.backend_id.to_string(),
                        x.epoch.to_string(),
                        if x.current { "current" } else { "stale" }.into(),
                    ]
                })
                .collect(),
        );
        println!(
            "{} entries shown, {} connection-table keys read{}",
            r.flows.len(),
            r.scanned,
            if r.truncated {
                " (more match: --limit)"
            } else {
                ""
            }
        );
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_and_without_ports() {
        assert_eq!(
            addr_port("10.0.0.1:443"),
            Some(("10.0.0.1".parse().unwrap(), Some(443)))
        );
        assert_eq!(
            addr_port("fd00::1"),
            Some(("fd00::1".parse().unwrap(), None))
        );
        assert_eq!(
            addr_port("[fd00::1]:53"),
            Some(("fd00::1".parse().unwrap(), Some(53)))
        );
        assert_eq!(addr_port("api"), None);
    }
}
