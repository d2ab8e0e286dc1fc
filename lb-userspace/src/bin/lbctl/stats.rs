//! `lbctl stats`.

use anyhow::Result;
use lb_userspace::status::StatsRow;

use crate::{
    Ctx,
    output::{ago, opt, table},
};

pub async fn run(ctx: &Ctx) -> Result<()> {
    let v: StatsRow = ctx.client.get("/v1/stats").await?;
    ctx.show(&v, print)
}

fn print(v: &StatsRow) {
    let count = &v.conntrack_count;
    for (k, val) in [
        ("interface", v.interface.clone()),
        ("uptime_s", v.uptime_s.to_string()),
        (
            "conntrack_entries",
            format!(
                "{} (counted {})",
                v.conntrack_entries,
                ago((count.counted_at_unix_ms > 0).then_some(count.counted_at_unix_ms))
            ),
        ),
        ("conntrack_size", v.conntrack_size.to_string()),
        ("table_size", v.table_size.to_string()),
        ("reloads", v.reloads.to_string()),
        ("reload_failures", v.reload_failures.to_string()),
        ("last_reload_error", opt(&v.last_reload_error)),
    ] {
        println!("{k:<20} {val}");
    }
    let f = &v.syn_flood;
    println!(
        "{:<20} {} new connections/s against {} entries (flood mode above {}/s: {})",
        "syn_flood",
        f.new_connections_per_s,
        f.conntrack_size,
        f.threshold_per_s,
        if f.active { "ON" } else { "off" }
    );
    if let Some(sync) = &v.sync {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        print!("{}", lb_userspace::sync::status::summary(sync));
        println!();
        table(
            &lb_userspace::sync::status::PEER_HEADER,
            lb_userspace::sync::status::peer_rows(sync, now),
        );
    }
    println!();
    table(
        &["COUNTER", "PACKETS"],
        v.counters
            .iter()
            .map(|(k, c)| vec![k.clone(), c.to_string()])
            .collect(),
    );
}
