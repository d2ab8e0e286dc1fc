//! The sync's status: the rows `GET /v1/stats` carries (filled by `daemon/sync.rs`), the
//! lines and peer table `lbctl stats` prints and the metrics `/metrics` exports (pure).

use std::net::IpAddr;

use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::metrics::{counter_family, gauge_family, labels};

/// What this node exchanged with one peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncPeerRow {
    pub address: IpAddr,
    pub sent_datagrams: u64,
    /// Exception entries sent to this peer.
    pub sent_entries: u64,
    /// Authentic datagrams received from it.
    pub received_datagrams: u64,
    pub received_entries: u64,
    /// Its entries installed in this node's connection table.
    pub installed: u64,
    /// Unix time (ms) of the last authentic datagram from the peer; 0: never.
    pub last_received_unix_ms: u64,
    /// How old that datagram was when it arrived (ms; clock skew included).
    pub lag_ms: u64,
}

impl SyncPeerRow {
    pub fn new(address: IpAddr) -> SyncPeerRow {
        SyncPeerRow {
            address,
            sent_datagrams: 0,
            sent_entries: 0,
            received_datagrams: 0,
            received_entries: 0,
            installed: 0,
            last_received_unix_ms: 0,
            lag_ms: 0,
        }
    }
}

/// Why the entries of the last scan that are not exceptions are not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotExceptionsRow {
    /// Written with an epoch the pair no longer has (the data plane ignores them).
    pub stale: u64,
    /// Of a service this node does not forward.
    pub not_forwarded: u64,
    /// On their Maglev slot: any node finds the backend by hashing.
    pub on_slot: u64,
}

/// Datagrams and records refused, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedRow {
    /// Datagrams from an address that is no configured peer.
    pub not_a_peer: u64,
    /// Datagrams whose HMAC tag did not check out (another key, or altered).
    pub auth: u64,
    pub malformed: u64,
    /// Datagrams whose sequence number was seen before (for the sender's run and clock epoch),
    /// is more than 60 s from this node's clock, or that are this node's own sent back to it.
    pub replay: u64,
    /// Records of a service not configured here.
    pub no_service: u64,
    /// Records naming a backend not in the service's set here.
    pub no_backend: u64,
    /// Records of datagrams sent before their sender heard this node's current run (sent to
    /// an earlier run of this lbd, or captured then and replayed): ignored; the sender's next
    /// full send carries them.
    #[serde(default)]
    pub earlier_run: u64,
}

impl RefusedRow {
    pub fn by_reason(&self) -> [(&'static str, u64); 7] {
        [
            ("not_a_peer", self.not_a_peer),
            ("auth", self.auth),
            ("malformed", self.malformed),
            ("replay", self.replay),
            ("no_service", self.no_service),
            ("no_backend", self.no_backend),
            ("earlier_run", self.earlier_run),
        ]
    }

    pub fn total(&self) -> u64 {
        self.by_reason().iter().map(|(_, n)| n).sum()
    }
}

/// The `sync` object of `GET /v1/stats` (only with `[sync]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRow {
    pub peers: Vec<SyncPeerRow>,
    pub scans: u64,
    /// Duration of the last scan.
    pub scan_ms: u64,
    pub last_scan_unix_ms: u64,
    /// Entries the last scan found off their Maglev slot (what is shared).
    pub exceptions: u64,
    /// Entries the last scan looked at (LRU hash and flow cache; one flow may be in both).
    pub scanned: u64,
    pub scanned_not_exceptions: NotExceptionsRow,
    /// Entries sent, summed over the peers.
    pub sent_entries: u64,
    pub sent_datagrams: u64,
    pub send_errors: u64,
    /// Datagrams the kernel dropped on the sync socket (its receive queue was full).
    #[serde(default)]
    pub receive_drops: u64,
    pub received_datagrams: u64,
    pub received_entries: u64,
    pub installed: u64,
    /// Received entries not installed because this node had an entry for the flow.
    pub already_present: u64,
    pub install_errors: u64,
    /// Retractions sent, summed over the peers: connections sent as exceptions that now sit
    /// on their slot (their 5-tuple reused by a new connection).
    #[serde(default)]
    pub retractions_sent: u64,
    /// Entries removed on a peer's retraction.
    #[serde(default)]
    pub retracted: u64,
    /// Last scans before a stop.
    pub flushes: u64,
    pub refused: RefusedRow,
    /// This node's clock went back (NTP stepping a clock that was ahead) since lbd started:
    /// the last step. Its datagrams were then numbered from the clock again in a new epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_stepped_back: Option<ClockStep>,
}

/// A step back of this node's clock, as the sync's numbering saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockStep {
    /// How far back (ms).
    pub by_ms: u64,
    /// The clock after the step (Unix ms).
    pub at_unix_ms: u64,
    /// The epoch numbering started again in.
    pub epoch: u32,
}

/// The node's line for `lbctl stats`.
pub fn summary(sync: &SyncRow) -> String {
    let refused = sync.refused.total();
    let reasons: Vec<String> = sync
        .refused
        .by_reason()
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    format!(
        "{:<20} {} exceptions of {} entries scanned ({} ms); sent {} entries in {} datagrams; installed {} (already present {}); retracted {} sent, {} removed; refused {refused}{}{}{}\n",
        "sync",
        sync.exceptions,
        sync.scanned,
        sync.scan_ms,
        sync.sent_entries,
        sync.sent_datagrams,
        sync.installed,
        sync.already_present,
        sync.retractions_sent,
        sync.retracted,
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        },
        if sync.receive_drops == 0 {
            String::new()
        } else {
            format!(
                "; {} datagrams dropped by the kernel (receive queue full)",
                sync.receive_drops
            )
        },
        match sync.clock_stepped_back {
            None => String::new(),
            Some(c) => format!(
                "; the clock stepped back {:.1} s (at Unix ms {}): datagrams numbered from the clock again (epoch {}), peers accept them",
                c.by_ms as f64 / 1000.0,
                c.at_unix_ms,
                c.epoch
            ),
        },
    )
}

/// Header of [`peer_rows`].
pub const PEER_HEADER: [&str; 7] = [
    "SYNC PEER",
    "LAST HEARD",
    "LAG MS",
    "SENT DATAGRAMS",
    "SENT ENTRIES",
    "RECEIVED ENTRIES",
    "INSTALLED",
];

/// One row per peer for `lbctl stats`: when it was last heard from, how old its datagram was,
/// and the entries exchanged with it.
pub fn peer_rows(sync: &SyncRow, now_unix_ms: u64) -> Vec<Vec<String>> {
    sync.peers
        .iter()
        .map(|p| {
            let (heard, lag) = if p.last_received_unix_ms == 0 {
                ("never".to_string(), "-".to_string())
            } else {
                (
                    format!(
                        "{:.1} s ago",
                        now_unix_ms.saturating_sub(p.last_received_unix_ms) as f64 / 1000.0
                    ),
                    p.lag_ms.to_string(),
                )
            };
            vec![
                p.address.to_string(),
                heard,
                lag,
                p.sent_datagrams.to_string(),
                p.sent_entries.to_string(),
                p.received_entries.to_string(),
                p.installed.to_string(),
            ]
        })
        .collect()
}

/// `lb_sync_*` metrics (only called with `[sync]`).
pub fn render_metrics(r: &mut Registry, sync: &SyncRow) {
    gauge_family(
        r,
        "sync_exceptions",
        "Connection-table entries the last scan found off their Maglev slot (shared with the peers).",
        None,
        [(labels(&[]), sync.exceptions as i64)],
    );
    for (name, value, help) in [
        (
            "sync_sent_entries",
            sync.sent_entries,
            "Exception entries sent to peers (one per peer).",
        ),
        (
            "sync_installed_entries",
            sync.installed,
            "Peers' entries installed in this node's connection table.",
        ),
        (
            "sync_present_entries",
            sync.already_present,
            "Peers' entries not installed because this node had an entry for the flow.",
        ),
        (
            "sync_retractions_sent",
            sync.retractions_sent,
            "Retractions sent to peers (one per peer): exceptions whose 5-tuple a new connection took on its slot.",
        ),
        (
            "sync_retracted_entries",
            sync.retracted,
            "Entries removed from this node's connection table on a peer's retraction.",
        ),
        (
            "sync_send_errors",
            sync.send_errors,
            "Sync datagrams that could not be sent.",
        ),
        (
            "sync_receive_drops",
            sync.receive_drops,
            "Sync datagrams the kernel dropped on this node's socket (its receive queue was full).",
        ),
    ] {
        counter_family(r, name, help, None, [(labels(&[]), value)]);
    }
    counter_family(
        r,
        "sync_refused",
        "Sync datagrams (not_a_peer, auth, malformed, replay) or records (no_service, no_backend) refused, by reason.",
        None,
        sync.refused
            .by_reason()
            .into_iter()
            .map(|(k, v)| (labels(&[("reason", k.to_string())]), v)),
    );
    let peer = |p: &SyncPeerRow| labels(&[("peer", p.address.to_string())]);
    gauge_family(
        r,
        "sync_peer_lag",
        "Age of the last datagram from each peer when it arrived (clock skew included).",
        None,
        sync.peers.iter().map(|p| (peer(p), p.lag_ms as i64)),
    );
    counter_family(
        r,
        "sync_peer_received_entries",
        "Entries received from each peer.",
        None,
        sync.peers.iter().map(|p| (peer(p), p.received_entries)),
    );
    counter_family(
        r,
        "sync_peer_sent_entries",
        "Entries sent to each peer.",
        None,
        sync.peers.iter().map(|p| (peer(p), p.sent_entries)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> SyncRow {
        let mut a = SyncPeerRow::new("10.0.0.2".parse().unwrap());
        a.last_received_unix_ms = 9_000;
        a.lag_ms = 4;
        a.received_datagrams = 3;
        a.received_entries = 51;
        a.installed = 51;
        a.sent_datagrams = 16;
        a.sent_entries = 255;
        let mut b = SyncPeerRow::new("10.0.0.3".parse().unwrap());
        b.sent_datagrams = 16;
        b.sent_entries = 255;
        SyncRow {
            peers: vec![a, b],
            exceptions: 51,
            scanned: 300,
            scan_ms: 89,
            sent_entries: 510,
            sent_datagrams: 32,
            installed: 51,
            already_present: 3,
            refused: RefusedRow {
                auth: 2,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn text_names_the_peers_their_lag_and_what_was_exchanged() {
        let t = summary(&sample());
        assert!(t.contains("51 exceptions of 300 entries"), "{t}");
        assert!(t.contains("refused 2 (auth 2)"), "{t}");
        let rows = peer_rows(&sample(), 10_000);
        assert_eq!(
            rows[0],
            ["10.0.0.2", "1.0 s ago", "4", "16", "255", "51", "51"]
        );
        assert_eq!(rows[1][..3], ["10.0.0.3", "never", "-"]);
        assert_eq!(rows[0].len(), PEER_HEADER.len());
        let quiet = SyncRow::default();
        assert!(
            summary(&quiet).ends_with("refused 0\n"),
            "{}",
            summary(&quiet)
        );
    }

    #[test]
    fn a_clock_step_back_is_said() {
        assert!(!summary(&sample()).contains("clock"));
        let mut s = sample();
        s.clock_stepped_back = Some(ClockStep {
            by_ms: 600_000,
            at_unix_ms: 1_800_000_000_000,
            epoch: 1,
        });
        let t = summary(&s);
        assert!(
            t.contains("the clock stepped back 600.0 s") && t.contains("(epoch 1)"),
            "{t}"
        );
        let back: SyncRow = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn the_rows_round_trip_with_the_api_field_names() {
        let v = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["refused"]["auth"], 2);
        assert_eq!(v["peers"][0]["address"], "10.0.0.2");
        assert_eq!(v["peers"][0]["lag_ms"], 4);
        assert_eq!(v["scanned_not_exceptions"]["on_slot"], 0);
        let back: SyncRow = serde_json::from_value(v).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn metrics_carry_the_counts() {
        let mut r = Registry::with_prefix("lb");
        render_metrics(&mut r, &sample());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(out.contains("lb_sync_exceptions 51"), "{out}");
        assert!(
            out.contains("lb_sync_refused_total{reason=\"auth\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("lb_sync_peer_lag{peer=\"10.0.0.2\"} 4"),
            "{out}"
        );
        assert!(
            out.contains("lb_sync_peer_sent_entries_total{peer=\"10.0.0.3\"} 255"),
            "{out}"
        );
    }
}
