//! `lbctl explain CLIENT:PORT VIP:PORT [tcp|udp] [--ack]`: where one packet of this flow goes
//! now and why, as the running XDP program decides it (a dry run: nothing is written).

use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, anyhow};
use lb_common::{PROTO_TCP, PROTO_UDP};
use lb_userspace::{explain::ExplainQuery, status::ExplainRow};

use crate::{
    Ctx,
    output::{self, table},
};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
}

#[derive(clap::Args, Clone)]
pub struct Args {
    /// The client: ADDR:PORT ([v6]:PORT for IPv6).
    client: SocketAddr,
    /// The VIP service: ADDR:PORT ([v6]:PORT for IPv6).
    vip: SocketAddr,
    #[arg(value_enum, default_value = "tcp")]
    protocol: Proto,
    /// TCP: explain a segment of a connection already open (an ACK) instead of its first
    /// segment (a SYN). They differ when the flow has no entry and its slot's backend takes no
    /// new connections: a SYN skips it, a mid-connection segment stays with it.
    #[arg(long)]
    ack: bool,
}

pub async fn run(ctx: &Ctx, a: Args) -> Result<()> {
    if a.client.is_ipv4() != a.vip.is_ipv4() {
        return Err(anyhow!(
            "{}: not the address family of the VIP {}",
            a.client,
            a.vip
        ));
    }
    let q = ExplainQuery {
        client: a.client.ip(),
        client_port: a.client.port(),
        vip: a.vip.ip(),
        port: a.vip.port(),
        protocol: match a.protocol {
            Proto::Tcp => PROTO_TCP,
            Proto::Udp => PROTO_UDP,
        },
        syn: !a.ack,
    };
    let r: ExplainRow = ctx
        .client
        .get(&format!("/v1/explain?{}", q.query()))
        .await?;
    let wide = ctx.out.wide();
    ctx.show(&r, |r| {
        let sock =
            |a: Option<IpAddr>, p: u16| a.map_or("-".into(), |a| SocketAddr::new(a, p).to_string());
        let opt = |a: Option<IpAddr>| a.map_or("-".into(), |a| a.to_string());
        let mut headers = vec![
            "CLIENT", "VIP", "PROTO", "PACKET", "VERDICT", "REASON", "BACKEND",
        ];
        let mut row = vec![
            sock(r.client, r.client_port),
            output::with_name(sock(r.vip, r.port), &r.vip_name),
            r.protocol.clone(),
            r.packet.clone(),
            r.verdict.clone(),
            r.reason.clone(),
            opt(r.backend),
        ];
        if wide {
            headers.extend(["SLOT", "SLOT BACKEND", "ENTRY", "DST MAC", "ENCAP"]);
            row.extend([
                r.slot.map_or("-".into(), |s| s.to_string()),
                opt(r.slot_backend),
                r.entry.clone().unwrap_or("-".into()),
                r.dst_mac.clone().unwrap_or("-".into()),
                opt(r.encap_dst),
            ]);
        }
        table(&headers, vec![row]);
        println!();
        for (i, s) in r.steps.iter().enumerate() {
            println!("{}. {s}", i + 1);
        }
    })
}
