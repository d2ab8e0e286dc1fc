//! `lbctl vips list [VIP]`.

use anyhow::Result;
use clap::Subcommand;
use lb_userspace::status::VipRow;

use crate::{
    Ctx,
    output::{opt, table},
};

#[derive(Subcommand, Clone)]
pub enum Cmd {
    /// List VIP services, all or those of VIP (name or address).
    List { vip: Option<String> },
}

pub async fn run(ctx: &Ctx, cmd: Cmd) -> Result<()> {
    let Cmd::List { vip } = cmd;
    let mut rows: Vec<VipRow> = ctx.client.get("/v1/vips").await?;
    if let Some(vip) = &vip {
        rows.retain(|r| r.is(vip));
    }
    ctx.show(&rows, |rows| print(rows, ctx.out.wide()))
}

fn print(rows: &[VipRow], wide: bool) {
    let mut headers = vec!["NAME", "VIP", "PORT", "OWNED", "VRRP", "ACTIVE"];
    if wide {
        headers.extend(["PACKETS", "BYTES", "FLOWS"]);
    }
    let rows = rows
        .iter()
        .map(|x| {
            let mut r = vec![
                x.name.clone(),
                x.vip.to_string(),
                format!("{}/{}", x.port_label(), x.protocol),
                if x.owned { "yes" } else { "no" }.into(),
                opt(&x.vrrp),
                if x.fail_open {
                    // Every backend fails its checks softly; new flows still go to them.
                    format!("{}/{} fail-open", x.backends_active, x.backends_total)
                } else {
                    format!("{}/{}", x.backends_active, x.backends_total)
                },
            ];
            if wide {
                r.extend([
                    x.packets.to_string(),
                    x.bytes.to_string(),
                    x.new_flows.to_string(),
                ]);
            }
            r
        })
        .collect();
    table(&headers, rows);
}
