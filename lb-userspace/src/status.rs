//! The daemon's status rows: what the `/v1` API serves, `lbctl` prints and the metrics export.
//! One set of types, `Serialize + Deserialize`, so the daemon writes them, `lbctl` reads them
//! back and the metrics encode them without anyone indexing untyped JSON. They belong to
//! neither the daemon (which fills them) nor the metrics or the CLI (which read them), so no
//! two of those modules import each other. docs/api.md documents each row's fields.

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

pub use crate::bgp::{PrefixStatus, Status as BgpStatus, frr::Session as BgpSession};
pub use crate::vrrp::instance::{
    Counters as VrrpCounters, InstanceStatus, SendErrorRecord, SplitBrainRecord, TransitionRecord,
};
pub use crate::vrrp::{
    collision::{Collision, Collisions, Mismatch},
    state::State as VrrpState,
};

/// `*` for a service of every port of its address, else the port.
pub fn port_label(port: u16) -> String {
    if port == lb_common::ALL_PORTS {
        "*".into()
    } else {
        port.to_string()
    }
}

/// The last health check of a backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRow {
    /// `"ok"`, the failure, or `""` before the first check.
    pub result: String,
    pub duration_ms: Option<u64>,
    pub at_unix_ms: Option<u64>,
    pub checks_run: u64,
    pub checks_failed: u64,
}

/// One row of `GET /v1/backends` (`lbctl backends list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendRow {
    pub vip_name: String,
    pub vip: IpAddr,
    /// 0: every port (`*`).
    pub port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    pub backend: IpAddr,
    /// The backend's MAC, `local` for this node, `""` while unresolved.
    pub mac: String,
    pub weight: u32,
    /// `active`, `draining`, `down`, ... (plan's backend state).
    pub state: String,
    pub reason: String,
    pub local: bool,
    /// The health verdict (true when not checked).
    pub healthy: bool,
    /// Expected to serve: false when its check finds nothing listening and the VIP's check
    /// has `absent_when_refused` (a node without a router): a "backend down" alert skips it.
    #[serde(default = "yes")]
    pub expected: bool,
    pub drained: bool,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    /// None when the VIP has no health check.
    pub check: Option<CheckRow>,
}

impl BackendRow {
    pub fn port_label(&self) -> String {
        port_label(self.port)
    }
    /// The row belongs to `vip`, given by name or address.
    pub fn of_vip(&self, vip: &str) -> bool {
        self.vip_name == vip || self.vip.to_string() == vip
    }
}

/// One row of `GET /v1/vips` (`lbctl vips list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipRow {
    pub name: String,
    pub vip: IpAddr,
    /// 0: every port (`*`).
    pub port: u16,
    pub protocol: String,
    pub owned: bool,
    /// The VRRP instance that decides ownership, if any.
    pub vrrp: Option<String>,
    pub backends_active: usize,
    pub backends_total: usize,
    /// Every backend fails its checks, softly: new flows go to them anyway (state `fail-open`).
    #[serde(default)]
    pub fail_open: bool,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

impl VipRow {
    pub fn port_label(&self) -> String {
        port_label(self.port)
    }
    pub fn is(&self, vip: &str) -> bool {
        self.name == vip || self.vip.to_string() == vip
    }
}

/// The flood view of `GET /v1/stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynFloodRow {
    /// Misses that would write a connection-table entry, per second, node-wide.
    pub new_connections_per_s: u64,
    pub conntrack_size: u32,
    /// `syn_flood_rate`: the node-wide rate above which flood mode starts.
    pub threshold_per_s: u32,
    /// Flood mode holds: no miss writes an entry.
    pub active: bool,
}

/// The background count of the connection table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackCountRow {
    pub entries: u64,
    /// 0 before the first count.
    pub counted_at_unix_ms: u64,
    pub walk_ms: u64,
}

/// `GET /v1/stats` (`lbctl stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsRow {
    pub interface: String,
    /// `/readyz` would answer 200.
    pub ready: bool,
    pub uptime_s: u64,
    pub conntrack_entries: u64,
    pub conntrack_count: ConntrackCountRow,
    pub conntrack_size: u32,
    pub syn_flood: SynFloodRow,
    pub table_size: u32,
    /// Reloads applied.
    pub reloads: u64,
    /// Reloads refused or rolled back (the running config stayed).
    pub reload_failures: u64,
    pub last_reload_error: Option<String>,
    /// The XDP program's counters by verdict or reason (lb-common's `stat::NAMES`).
    pub counters: BTreeMap<String, u64>,
    /// The connection sync (`[sync]`), as `daemon/sync.rs` reports it; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<crate::sync::status::SyncRow>,
}

/// One tracked check of a VRRP instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackRow {
    pub name: String,
    pub weight: i32,
    /// The address checked, or `load balancer ready`.
    pub check: String,
    pub passing: bool,
}

/// One element of `GET /v1/vrrp` (`lbctl vrrp status`): the instance's own status and what the
/// daemon's tracked checks add to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VrrpRow {
    #[serde(flatten)]
    pub instance: InstanceStatus,
    pub tracks: Vec<TrackRow>,
    /// Sum of the failing tracked checks' weights.
    pub track_weight: i32,
    /// A failing tracked check of weight 0 holds the instance in FAULT.
    pub track_fault: bool,
    /// The instances it moves together with (`group`, see [`crate::vrrp::group`]); its
    /// `track_weight` and `track_fault` are then the group's.
    #[serde(default)]
    pub group: Option<String>,
}

/// `GET /v1/version` (`lbctl version`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRow {
    pub version: String,
    /// The git commit lbd was built from, when the build knew it.
    pub commit: Option<String>,
}

impl VersionRow {
    /// This binary's version.
    pub fn this() -> Self {
        VersionRow {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: option_env!("LB_GIT_COMMIT").map(str::to_owned),
        }
    }
}

/// One entry of `GET /v1/flows` (`lbctl flows`): a connection-table or flow-cache entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRow {
    /// `conntrack` (the LRU table) or `cache` (the per-slot copy in front of it).
    pub table: String,
    pub client: IpAddr,
    /// 0 for protocols without ports.
    pub client_port: u16,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: String,
    /// The backend slot the entry names, and the pair epoch it was written with.
    pub backend_id: u32,
    pub epoch: u32,
    /// The pair that slot holds now: VIP name and backend address, when it is installed.
    pub vip_name: Option<String>,
    pub backend: Option<IpAddr>,
    /// The entry's epoch is the pair's current one: packets of this flow go to `backend`. A
    /// stale entry is ignored by the data plane (the flow hashes again).
    pub current: bool,
    /// The client closed the connection the entry was written for (a FIN or RST went
    /// through): its last segments still follow it, a SYN on the 5-tuple is placed afresh.
    pub client_closed: bool,
}

/// `GET /v1/flows`: matching entries, at most `limit`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowsRow {
    pub flows: Vec<FlowRow>,
    /// Connection-table keys read (the walk stops at `limit` matches).
    pub scanned: u64,
    /// More entries may match than were returned.
    pub truncated: bool,
}

/// `GET /v1/explain` (`lbctl explain`): where one packet of a flow goes now and why, as the
/// running XDP program decided it in a dry run (it wrote no entry and no counter).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainRow {
    pub client: Option<IpAddr>,
    pub client_port: u16,
    pub vip: Option<IpAddr>,
    pub port: u16,
    pub protocol: String,
    /// The packet asked about: `syn`, `ack` or `datagram`.
    pub packet: String,
    /// The XDP verdict: `tx`, `redirect` (sent to a backend), `pass` (to this node's stack) or
    /// `drop`.
    pub verdict: String,
    /// The counter that explains the verdict (as in `lbctl stats`).
    pub reason: String,
    /// The connection-table counter the packet would add to (`conntrack_hit`, `_miss`, ...).
    pub conntrack: Option<String>,
    /// The VIP service's name, when one matched; and whether this node forwards for it.
    pub vip_name: Option<String>,
    pub owned: bool,
    /// Where a connection-table entry for the flow was found (`cache` or `conntrack`), the
    /// backend it names, and whether its pair still stands (else it is ignored, stale).
    pub entry: Option<String>,
    pub entry_backend: Option<IpAddr>,
    pub entry_current: bool,
    /// That entry's connection was closed by the client (a FIN or RST went through): a SYN
    /// opens a new connection on the 5-tuple and is placed afresh.
    pub entry_closed: bool,
    /// The decision followed that entry.
    pub entry_used: bool,
    /// The Maglev slot the flow hashes to, and the backend the live table names there.
    pub slot: Option<u32>,
    pub slot_backend: Option<IpAddr>,
    /// The slot's backend takes no new flows (`skip_reason`: its state, e.g. `drained`), so
    /// this packet, which starts a flow, took the new-flow table's backend instead.
    pub skipped: bool,
    pub skip_reason: Option<String>,
    /// Followed the handshake table (its SYN skipped the slot in flood mode).
    pub handshake: bool,
    /// The backend the packet goes to: its slot id and address (`None`: to no backend).
    pub backend_id: Option<u32>,
    pub backend: Option<IpAddr>,
    /// The frame as it would leave: destination and source MAC, and the outer destination when
    /// wrapped for a routed backend.
    pub dst_mac: Option<String>,
    pub src_mac: Option<String>,
    pub encap_dst: Option<IpAddr>,
    /// A real packet would write a connection-table entry; flood mode is on (it would not).
    pub would_remember: bool,
    pub flood: bool,
    /// The loop guard fired (the source is another lbd node).
    pub from_peer: bool,
    /// The decision's steps, in order, in words.
    pub steps: Vec<String>,
}

/// One data-plane decision of `GET /v1/trace` (`lbctl trace`), as the XDP program noted it
/// for a real packet while the trace was attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRow {
    pub client: IpAddr,
    pub client_port: u16,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: String,
    /// `tx`, `redirect`, `pass` or `drop`.
    pub verdict: String,
    /// The counter that explains the verdict (as in `lbctl stats`).
    pub reason: String,
    pub conntrack: Option<String>,
    /// Where the flow's connection-table entry was found (`cache`, `conntrack`), the backend
    /// slot it named, and whether the decision followed it.
    pub entry: Option<String>,
    pub entry_backend_id: Option<u32>,
    pub entry_used: bool,
    /// The Maglev slot and its backend, when the table was consulted; whether that backend was
    /// skipped (it takes no new flows).
    pub slot: Option<u32>,
    pub slot_backend: Option<IpAddr>,
    pub skipped: bool,
    /// The backend the packet went to.
    pub backend_id: Option<u32>,
    pub backend: Option<IpAddr>,
    /// The packet wrote its flow's connection-table entry; flood mode kept it from writing one.
    pub remembered: bool,
    pub flood: bool,
}

/// `GET /v1/trace`: the decisions sampled while the trace was attached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracesRow {
    pub decisions: Vec<TraceRow>,
    /// Decisions of other VIPs or ports read and left out by the filter.
    pub filtered: u64,
    /// The wait ended before `count` decisions matched.
    pub timed_out: bool,
}

/// The answer to a POST that changes something (`drain`, `reload`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRow {
    pub error: String,
}

fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_what_they_wrote() {
        let s = StatsRow {
            interface: "eth0".into(),
            counters: [("forwarded".to_string(), 3)].into(),
            last_reload_error: Some("bad".into()),
            ..Default::default()
        };
        let back: StatsRow = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(port_label(0), "*");
        assert_eq!(port_label(443), "443");
    }

    /// The top-level fields of a document, and those of its nested objects.
    fn fields(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    out.push(k.clone());
                    fields(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| fields(x, out)),
            _ => {}
        }
    }

    #[test]
    fn every_field_is_documented() {
        let doc = include_str!("../../docs/api.md");
        let backend = BackendRow {
            vip_name: "api".into(),
            vip: "10.0.0.1".parse().unwrap(),
            port: 6443,
            protocol: "tcp".into(),
            backend: "10.0.0.2".parse().unwrap(),
            mac: "local".into(),
            weight: 1,
            state: "active".into(),
            reason: String::new(),
            local: true,
            healthy: true,
            drained: false,
            expected: true,
            packets: 0,
            bytes: 0,
            new_flows: 0,
            check: Some(CheckRow {
                result: "ok".into(),
                duration_ms: Some(1),
                at_unix_ms: Some(1),
                checks_run: 1,
                checks_failed: 0,
            }),
        };
        let vip = VipRow {
            name: "api".into(),
            vip: "10.0.0.1".parse().unwrap(),
            port: 6443,
            protocol: "tcp".into(),
            owned: true,
            vrrp: None,
            backends_active: 1,
            backends_total: 1,
            fail_open: false,
            packets: 0,
            bytes: 0,
            new_flows: 0,
        };
        let mut all = Vec::new();
        fields(&serde_json::to_value(&backend).unwrap(), &mut all);
        fields(&serde_json::to_value(&vip).unwrap(), &mut all);
        let mut stats = serde_json::to_value(StatsRow {
            sync: Some(crate::sync::status::SyncRow {
                peers: vec![crate::sync::status::SyncPeerRow::new(
                    "10.0.0.2".parse().unwrap(),
                )],
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        // Counter names are data, documented in docs/metrics.md.
        stats["counters"] = serde_json::json!({});
        fields(&stats, &mut all);
        fields(&serde_json::to_value(VersionRow::this()).unwrap(), &mut all);
        fields(
            &serde_json::to_value(FlowsRow {
                flows: vec![FlowRow {
                    table: "conntrack".into(),
                    client: "10.0.0.9".parse().unwrap(),
                    client_port: 1,
                    vip: "10.0.0.1".parse().unwrap(),
                    port: 1,
                    protocol: "tcp".into(),
                    backend_id: 1,
                    epoch: 1,
                    vip_name: None,
                    backend: None,
                    current: false,
                    client_closed: false,
                }],
                scanned: 1,
                truncated: false,
            })
            .unwrap(),
            &mut all,
        );
        fields(
            &serde_json::to_value(TracesRow {
                decisions: vec![TraceRow {
                    client: "10.0.0.9".parse().unwrap(),
                    client_port: 1,
                    vip: "10.0.0.1".parse().unwrap(),
                    port: 1,
                    protocol: "tcp".into(),
                    verdict: "tx".into(),
                    reason: "forwarded".into(),
                    conntrack: None,
                    entry: None,
                    entry_backend_id: None,
                    entry_used: false,
                    slot: None,
                    slot_backend: None,
                    skipped: false,
                    backend_id: None,
                    backend: None,
                    remembered: false,
                    flood: false,
                }],
                filtered: 0,
                timed_out: false,
            })
            .unwrap(),
            &mut all,
        );
        fields(
            &serde_json::to_value(ExplainRow {
                client: Some("10.0.0.9".parse().unwrap()),
                ..Default::default()
            })
            .unwrap(),
            &mut all,
        );
        fields(
            &serde_json::to_value(BgpStatus {
                enabled: true,
                asn: None,
                node_drained: false,
                sessions: vec![BgpSession::default()],
                sessions_error: None,
                prefixes: vec![PrefixStatus {
                    prefix: "10.0.0.1/32".into(),
                    vips: vec![],
                    announce: true,
                    installed: true,
                    reason: String::new(),
                }],
                bfd_detect_ms: None,
                last_error: None,
            })
            .unwrap(),
            &mut all,
        );
        let mut vrrp = serde_json::to_value(VrrpRow {
            instance: InstanceStatus {
                name: "api".into(),
                interface: "eth0".into(),
                vrid: 1,
                version: 3,
                state: VrrpState::Master,
                base_priority: 100,
                effective_priority: 100,
                primary_addr: "10.0.0.3".parse().unwrap(),
                master: None,
                advert_interval_ms: 1000,
                master_advert_interval_ms: 1000,
                vips: vec![],
                unicast_peers: vec![],
                owned: true,
                last_transition: Some(TransitionRecord {
                    at_unix_ms: 1,
                    from: VrrpState::Backup,
                    to: VrrpState::Master,
                    reason: String::new(),
                }),
                last_split_brain: Some(SplitBrainRecord {
                    at_unix_ms: 1,
                    peer: "10.0.0.4".parse().unwrap(),
                    peer_priority: 1,
                    stepped_down: false,
                    their_adverts: "ok".into(),
                }),
                last_send_error: Some(SendErrorRecord {
                    at_unix_ms: 1,
                    dst: "10.0.0.4".parse().unwrap(),
                    error: String::new(),
                }),
                counters: VrrpCounters::default(),
                collisions: Collisions::default(),
            },
            tracks: vec![TrackRow {
                name: "t".into(),
                weight: 1,
                check: "x".into(),
                passing: true,
            }],
            track_weight: 0,
            track_fault: false,
            group: Some("api".into()),
        })
        .unwrap();
        // Drop reasons and peer addresses are data; the collision record's fields are listed.
        vrrp["counters"]["drops"] = serde_json::json!({});
        fields(&vrrp, &mut all);
        all.sort();
        all.dedup();
        let missing: Vec<&String> = all
            .iter()
            .filter(|f| !doc.contains(&format!("`{f}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "fields missing from docs/api.md: {missing:?}"
        );
        // The round trip the CLI relies on.
        let back: VrrpRow = serde_json::from_value(vrrp).unwrap();
        assert_eq!(back.instance.name, "api");
    }
}
