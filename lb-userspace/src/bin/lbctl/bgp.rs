//! `lbctl bgp status|drain|undrain`.

use anyhow::Result;
use clap::Subcommand;
use hyper::Method;
use lb_userspace::status::BgpStatus;

use crate::{
    Ctx,
    output::{opt, table_text},
};

#[derive(Subcommand, Clone)]
pub enum Cmd {
    /// Sessions (BGP and BFD), announced prefixes and why a prefix is withdrawn.
    Status,
    /// Withdraw every prefix of this node: the routers stop sending it new flows, and flows
    /// already here continue through the other nodes.
    Drain,
    /// Announce again what is ready.
    Undrain,
}

pub async fn run(ctx: &Ctx, cmd: Cmd) -> Result<()> {
    let path = match cmd {
        Cmd::Status => {
            let v: BgpStatus = ctx.client.get("/v1/bgp").await?;
            return ctx.show(&v, |v| print!("{}", text(v)));
        }
        Cmd::Drain => "/v1/bgp/drain",
        Cmd::Undrain => "/v1/bgp/undrain",
    };
    let v = ctx.client.call(Method::POST, path, None).await?;
    ctx.show(&v, |v| {
        match serde_json::from_value::<BgpStatus>(v.clone()) {
            Ok(s) => print!("{}", text(&s)),
            Err(_) => println!("{v}"),
        }
    })
}

/// `lbctl bgp status` as text.
pub fn text(v: &BgpStatus) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if !v.enabled {
        return "BGP not configured (no [[bgp]] section)\n".into();
    }
    let _ = writeln!(
        o,
        "local AS {}   node {}   BFD detection {} ms",
        opt(&v.asn),
        if v.node_drained {
            "DRAINED"
        } else {
            "in service"
        },
        opt(&v.bfd_detect_ms)
    );
    if let Some(e) = &v.sessions_error {
        let _ = writeln!(o, "sessions: cannot read from FRR: {e}");
    }
    o.push('\n');
    o += &table_text(
        &["PEER", "AS", "STATE", "UP", "V4", "V6", "BFD"],
        v.sessions
            .iter()
            .map(|s| {
                vec![
                    match &s.description {
                        Some(d) => format!("{} ({d})", s.peer),
                        None => s.peer.clone(),
                    },
                    s.asn.to_string(),
                    s.state.clone(),
                    s.uptime.clone(),
                    s.sent_v4.to_string(),
                    s.sent_v6.to_string(),
                    s.bfd.clone(),
                ]
            })
            .collect(),
    );
    o.push('\n');
    o += &table_text(
        &["PREFIX", "STATE", "VIPS", "REASON"],
        v.prefixes
            .iter()
            .map(|p| {
                let state = match (p.announce, p.installed) {
                    (true, true) => "announced",
                    (true, false) => "pending",
                    (false, true) => "withdrawing",
                    (false, false) => "withdrawn",
                };
                vec![
                    p.prefix.clone(),
                    state.into(),
                    p.vips.join(","),
                    p.reason.clone(),
                ]
            })
            .collect(),
    );
    if let Some(e) = &v.last_error {
        let _ = writeln!(o, "\nlast error: {e}");
    }
    o
}
