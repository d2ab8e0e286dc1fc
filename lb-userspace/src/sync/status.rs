//! The sync's status as `lbctl stats` prints it and `/metrics` exports it (pure: from the JSON
//! `daemon/sync.rs` reports in `/v1/stats`).

use prometheus_client::registry::Registry;
use serde_json::Value;

use crate::metrics::{counter_family, gauge_family, labels};

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A few lines for `lbctl stats`: one for the node, one per peer. Empty without `[sync]`.
pub fn text(sync: &Value, now_unix_ms: u64) -> String {
    if sync.is_null() {
        return String::new();
    }
    let r = &sync["refused"];
    let refused: u64 = r.as_object().map(|m| m.values().map(n).sum()).unwrap_or(0);
    let mut out = format!(
        "{:<20} {} exceptions of {} entries scanned ({} ms); sent {} entries in {} datagrams; installed {} (already present {}); refused {refused}{}\n",
        "sync",
        n(&sync["exceptions"]),
        n(&sync["scanned"]),
        n(&sync["scan_ms"]),
        n(&sync["sent_entries"]),
        n(&sync["sent_datagrams"]),
        n(&sync["installed"]),
        n(&sync["already_present"]),
        if refused > 0 {
            format!(" {r}")
        } else {
            String::new()
        },
    );
    for p in sync["peers"].as_array().into_iter().flatten() {
        let last = n(&p["last_received_unix_ms"]);
        let seen = if last == 0 {
            "never heard from".to_string()
        } else {
            format!(
                "last heard {:.1} s ago (lag {} ms)",
                now_unix_ms.saturating_sub(last) as f64 / 1000.0,
                n(&p["lag_ms"])
            )
        };
        out += &format!(
            "{:<20} {}: {seen}; received {} entries, installed {}; sent {} datagrams\n",
            "  peer",
            p["address"].as_str().unwrap_or("?"),
            n(&p["received_entries"]),
            n(&p["installed"]),
            n(&p["sent_datagrams"]),
        );
    }
    out
}

/// `lb_sync_*` metrics; nothing without `[sync]`.
pub fn render_metrics(r: &mut Registry, sync: &Value) {
    if sync.is_null() {
        return;
    }
    gauge_family(
        r,
        "sync_exceptions",
        "Connection-table entries the last scan found off their Maglev slot (shared with the peers).",
        None,
        [(labels(&[]), n(&sync["exceptions"]) as i64)],
    );
    for (name, key, help) in [
        (
            "sync_sent_entries",
            "sent_entries",
            "Exception entries sent to peers (one per peer).",
        ),
        (
            "sync_installed_entries",
            "installed",
            "Peers' entries installed in this node's connection table.",
        ),
        (
            "sync_present_entries",
            "already_present",
            "Peers' entries not installed because this node had an entry for the flow.",
        ),
        (
            "sync_send_errors",
            "send_errors",
            "Sync datagrams that could not be sent.",
        ),
    ] {
        counter_family(r, name, help, None, [(labels(&[]), n(&sync[key]))]);
    }
    let refused = sync["refused"].as_object().cloned().unwrap_or_default();
    counter_family(
        r,
        "sync_refused",
        "Sync datagrams (not_a_peer, auth, malformed, replay) or records (no_service, no_backend) refused, by reason.",
        None,
        refused
            .iter()
            .map(|(k, v)| (labels(&[("reason", k.clone())]), n(v))),
    );
    let peers = sync["peers"].as_array().cloned().unwrap_or_default();
    gauge_family(
        r,
        "sync_peer_lag",
        "Age of the last datagram from each peer when it arrived (clock skew included).",
        None,
        peers.iter().map(|p| {
            (
                labels(&[("peer", p["address"].as_str().unwrap_or("?").to_string())]),
                n(&p["lag_ms"]) as i64,
            )
        }),
    );
    counter_family(
        r,
        "sync_peer_received_entries",
        "Entries received from each peer.",
        None,
        peers.iter().map(|p| {
            (
                labels(&[("peer", p["address"].as_str().unwrap_or("?").to_string())]),
                n(&p["received_entries"]),
            )
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Value {
        serde_json::json!({
            "exceptions": 51, "scanned": 300, "scan_ms": 89, "sent_entries": 510,
            "sent_datagrams": 32, "installed": 51, "already_present": 3, "send_errors": 0,
            "refused": {"auth": 2, "not_a_peer": 0, "malformed": 0, "replay": 0, "no_service": 0, "no_backend": 0},
            "peers": [
                {"address": "10.0.0.2", "last_received_unix_ms": 9_000, "lag_ms": 4, "received_entries": 51, "installed": 51, "sent_datagrams": 16},
                {"address": "10.0.0.3", "last_received_unix_ms": 0, "lag_ms": 0, "received_entries": 0, "installed": 0, "sent_datagrams": 16}
            ]
        })
    }

    #[test]
    fn text_names_the_peers_and_what_was_refused() {
        let t = text(&sample(), 10_000);
        assert!(t.contains("51 exceptions of 300 entries"), "{t}");
        assert!(t.contains("refused 2"), "{t}");
        assert!(
            t.contains("10.0.0.2: last heard 1.0 s ago (lag 4 ms)"),
            "{t}"
        );
        assert!(t.contains("10.0.0.3: never heard from"), "{t}");
        assert_eq!(text(&Value::Null, 0), "");
    }

    #[test]
    fn metrics_carry_the_counts_and_nothing_without_sync() {
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
        let mut r = Registry::with_prefix("lb");
        render_metrics(&mut r, &Value::Null);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(!out.contains("sync"), "{out}");
    }
}
