//! `lbctl vrrp status [INSTANCE]`: one block per instance.

use anyhow::Result;
use clap::Subcommand;
use lb_userspace::status::VrrpRow;

use crate::{
    Ctx,
    output::{ago, opt},
};

#[derive(Subcommand, Clone)]
pub enum Cmd {
    /// Status of every VRRP instance, or of INSTANCE.
    Status { instance: Option<String> },
}

pub async fn run(ctx: &Ctx, cmd: Cmd) -> Result<()> {
    let Cmd::Status { instance } = cmd;
    let mut rows: Vec<VrrpRow> = ctx.client.get("/v1/vrrp").await?;
    if let Some(name) = &instance {
        rows.retain(|r| &r.instance.name == name);
    }
    ctx.show(&rows, |rows| print!("{}", text(rows)))
}

fn text(list: &[VrrpRow]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if list.is_empty() {
        o.push_str("no VRRP instances\n");
    }
    for row in list {
        let i = &row.instance;
        let _ = writeln!(
            o,
            "{} (VRID {}, VRRPv{}, {}): {}",
            i.name,
            i.vrid,
            i.version,
            i.interface,
            i.state.as_str().to_uppercase()
        );
        let _ = writeln!(
            o,
            "  priority     base {} effective {} (tracked {:+})",
            i.base_priority, i.effective_priority, row.track_weight
        );
        let _ = writeln!(
            o,
            "  master       {}   (we are {})",
            opt(&i.master),
            i.primary_addr
        );
        let _ = writeln!(
            o,
            "  interval     {} ms (master advertises {} ms)",
            i.advert_interval_ms, i.master_advert_interval_ms
        );
        let vips: Vec<String> = i.vips.iter().map(|v| v.to_string()).collect();
        let _ = writeln!(
            o,
            "  vips         {} (owned here: {})",
            vips.join(", "),
            i.owned
        );
        if let Some(t) = &i.last_transition {
            let _ = writeln!(
                o,
                "  last change  {} -> {} {}: {}",
                t.from.as_str(),
                t.to.as_str(),
                ago(Some(t.at_unix_ms)),
                t.reason
            );
        }
        let c = &i.counters;
        let _ = writeln!(
            o,
            "  adverts      sent {} received {} send errors {}; transitions {}; became master {}; split brain {}",
            c.adverts_sent,
            c.adverts_received,
            c.send_errors,
            c.transitions,
            c.became_master,
            c.split_brain
        );
        if let Some(e) = &i.last_send_error {
            let _ = writeln!(
                o,
                "  send error   {} to {}: {}",
                ago(Some(e.at_unix_ms)),
                e.dst,
                e.error
            );
        }
        let drops: Vec<String> = c
            .drops
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            o,
            "  drops        {}",
            if drops.is_empty() {
                "none".into()
            } else {
                drops.join(", ")
            }
        );
        let peers: Vec<String> = i
            .collisions
            .peers
            .iter()
            .map(|(peer, c)| {
                format!(
                    "{peer}: {} adverts, differs: {}",
                    c.count,
                    c.differs.describe()
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "  collisions   {}",
            if peers.is_empty() {
                "none".to_string()
            } else {
                peers.join("; ")
            }
        );
        for t in &row.tracks {
            let _ = writeln!(
                o,
                "  track        {} ({}): {:+} {}",
                t.name,
                t.check,
                t.weight,
                if t.passing { "passing" } else { "failing" }
            );
        }
    }
    o
}
