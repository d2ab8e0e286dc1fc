//! `GET /v1/explain`: the running XDP program's dry run on one packet of a flow, named with the
//! owner's view of VIPs and backends. In the owner: one test run (one syscall), one at a time,
//! and the program object it runs is the one attached.

use std::net::IpAddr;

use anyhow::Result;
use lb_common::{ALL_PORTS, explain::step};

use super::{format_mac, owner::Owner};
use crate::{
    explain::{self as ex, ExplainQuery},
    status::ExplainRow,
};

impl Owner {
    pub(super) fn explain(&mut self, q: &ExplainQuery) -> Result<ExplainRow> {
        let token = self.dp.explain_token()?;
        let run = self.dp.explain(&ex::frame(q, token, self.facts.if_mac))?;
        let r = run.record;
        let view = self.flows_view();
        let backends = self.backends()?;
        let addr_of = |id: u32| view.slots.get(&id).map(|s| s.1);
        let (entry_id, slot_id, chosen_id) = ex::ids(&r);
        let vip_name = self
            .cfg
            .services()
            .into_iter()
            .map(|(i, port)| (&self.cfg.vips[i], port))
            .filter(|(v, port)| {
                v.address == q.vip
                    && v.protocol.number() == q.protocol
                    && (*port == q.port || *port == ALL_PORTS)
            })
            // The exact port wins over "all ports", as in the program.
            .max_by_key(|(_, port)| *port == q.port)
            .map(|(v, _)| v.name.clone());
        let has = |bit: u32| r.steps & bit != 0;
        let out = ex::out_frame(&run.out).unwrap_or_default();
        let sent = matches!(run.verdict, 3 | 4);
        let mut row = ExplainRow {
            client: Some(q.client),
            client_port: q.client_port,
            vip: Some(q.vip),
            port: q.port,
            protocol: if q.protocol == lb_common::PROTO_UDP {
                "udp"
            } else {
                "tcp"
            }
            .into(),
            packet: q.packet().into(),
            verdict: ex::verdict_name(run.verdict).into(),
            reason: ex::stat_name(r.reason).unwrap_or("none").into(),
            conntrack: ex::stat_name(r.conntrack).map(str::to_owned),
            vip_name,
            owned: has(step::VIP_OWNED),
            entry: if has(step::ENTRY_CACHE) {
                Some("cache".into())
            } else if has(step::ENTRY_TABLE) {
                Some("conntrack".into())
            } else {
                None
            },
            entry_backend: entry_id.and_then(addr_of),
            entry_current: has(step::ENTRY_GOOD),
            entry_closed: has(step::ENTRY_CLOSED),
            entry_used: has(step::ENTRY_USED),
            slot: has(step::MAGLEV).then_some(r.slot),
            slot_backend: slot_id.and_then(addr_of),
            skipped: has(step::SKIPPED),
            skip_reason: None,
            handshake: has(step::HANDSHAKE),
            backend_id: chosen_id,
            backend: chosen_id.and_then(addr_of),
            dst_mac: sent.then(|| format_mac(&out.dst_mac)),
            src_mac: sent.then(|| format_mac(&out.src_mac)),
            encap_dst: if sent { out.encap_dst } else { None },
            would_remember: has(step::WOULD_REMEMBER),
            flood: has(step::FLOOD),
            from_peer: has(step::FROM_PEER),
            steps: Vec::new(),
        };
        // Why the slot's backend was skipped: its state as `lbctl backends` shows it.
        if row.skipped
            && let Some(name) = slot_id.and_then(|id| view.slots.get(&id))
        {
            row.skip_reason = backends
                .iter()
                .find(|x| x.vip_name == name.0 && x.backend == name.1)
                .map(|x| {
                    if x.reason.is_empty() {
                        x.state.clone()
                    } else {
                        format!("{} ({})", x.state, x.reason)
                    }
                });
        }
        row.steps = steps(&row, self.cfg.table_size, entry_id, slot_id);
        Ok(row)
    }
}

fn name(a: Option<IpAddr>, id: Option<u32>) -> String {
    match (a, id) {
        (Some(a), Some(id)) => format!("{a} (slot id {id})"),
        (None, Some(id)) => format!("backend id {id} (not installed now)"),
        _ => "none".into(),
    }
}

/// The trail in words, in the order the program took it.
fn steps(r: &ExplainRow, table_size: u32, entry: Option<u32>, slot_id: Option<u32>) -> Vec<String> {
    let mut s = Vec::new();
    if r.from_peer {
        s.push("loop guard: the source MAC is another lbd node's; to the local stack".into());
    }
    if let Some(t) = &r.entry {
        s.push(format!(
            "connection-table entry in the {t}: {}, {}",
            name(r.entry_backend, entry),
            if r.entry_closed && r.packet == "syn" && r.entry_used {
                "its connection was closed by the client less than 6.4 to 8.6 s ago: this SYN follows it"
            } else if r.entry_closed && r.packet == "syn" {
                "its connection was closed by the client: this SYN opens a new one, placed afresh"
            } else if r.entry_current {
                "its pair still stands"
            } else {
                "stale (its pair left or changed): ignored"
            }
        ));
    } else if !r.from_peer && r.reason != "pass_not_vip" {
        s.push("no connection-table entry".into());
    }
    if r.entry_used {
        s.push("followed the entry".into());
    } else if r.reason == "pass_not_vip" {
        s.push(
            "no VIP service for this address, port and protocol: not ours, to the local stack"
                .into(),
        );
    } else if r.reason == "pass_not_owner" {
        s.push("this node does not forward for the VIP (not its owner): to the local stack".into());
    }
    if let Some(slot) = r.slot {
        s.push(format!(
            "Maglev slot {slot} of {table_size}: {}",
            name(r.slot_backend, slot_id)
        ));
    }
    if r.skipped {
        s.push(format!(
            "the slot's backend takes no new flows ({}): this packet starts a flow, so it takes the new-flow table's backend",
            r.skip_reason.as_deref().unwrap_or("drained or down")
        ));
    }
    if r.handshake {
        s.push("follows its SYN's choice in the handshake table (flood mode)".into());
    }
    if r.backend_id.is_some() {
        s.push(format!("backend: {}", name(r.backend, r.backend_id)));
    }
    match (&r.dst_mac, r.encap_dst) {
        (Some(m), Some(d)) => s.push(format!(
            "wrapped for the routed backend {d}, sent to MAC {m}"
        )),
        (Some(m), None) => s.push(format!("MACs rewritten: sent to {m}")),
        _ => {}
    }
    if r.flood {
        s.push("flood mode: a real packet would write no connection-table entry".into());
    } else if r.would_remember {
        s.push("a real packet would write this choice into the connection table".into());
    }
    s.push(format!(
        "verdict {}: {}{}",
        r.verdict,
        r.reason,
        r.conntrack
            .as_ref()
            .map(|c| format!(", {c}"))
            .unwrap_or_default()
    ));
    s
}
