//! `GET /v1/flows`: the connection table and the flow cache read from their pins, beside the
//! owner (a walk is one syscall per key), bounded by a match limit. Reading a map never stops
//! the data plane: the XDP program keeps forwarding and writing while the walk runs, so the
//! answer is a sample of a moving table, not a snapshot.

use std::{collections::HashMap, net::IpAddr, path::PathBuf};

use anyhow::Result;
use lb_common::{FAMILY_V4, FlowKey, FlowValue, maps};

use crate::{
    api::FlowFilter,
    dataplane::sync_view::{FlowCachePins, LruPins},
    status::{FlowRow, FlowsRow},
};

/// Largest `limit` a request may ask for.
pub const MAX_LIMIT: usize = 10_000;

/// What the owner knows about backend slots: id -> (VIP name, backend, current epoch).
#[derive(Clone, Debug, Default)]
pub struct FlowsView {
    pub pin_dir: PathBuf,
    pub slots: HashMap<u32, (String, IpAddr, u32)>,
}

fn addr(bytes: &[u8; 16], family: u8) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])
    } else {
        IpAddr::from(*bytes)
    }
}

/// The entry as a row, if the filter keeps it.
fn row(
    view: &FlowsView,
    table: &str,
    k: &FlowKey,
    v: &FlowValue,
    f: &FlowFilter,
) -> Option<FlowRow> {
    let (client, vip) = (addr(&k.src, k.family), addr(&k.dst, k.family));
    let keep = f.vip.is_none_or(|a| a == vip)
        && f.port.is_none_or(|p| p == k.dport)
        && f.client.is_none_or(|a| a == client)
        && f.client_port.is_none_or(|p| p == k.sport);
    if !keep {
        return None;
    }
    let slot = view.slots.get(&v.backend());
    Some(FlowRow {
        table: table.into(),
        client,
        client_port: k.sport,
        vip,
        port: k.dport,
        protocol: match k.proto {
            6 => "tcp".into(),
            17 => "udp".into(),
            p => p.to_string(),
        },
        backend_id: v.backend(),
        epoch: v.epoch,
        vip_name: slot.map(|s| s.0.clone()),
        backend: slot.map(|s| s.1),
        current: slot.is_some_and(|s| s.2 == v.epoch),
        client_closed: v.client_closed(),
    })
}

/// Walk the pinned maps (blocking: run it off the async threads).
pub fn walk(view: &FlowsView, f: &FlowFilter) -> Result<FlowsRow> {
    let limit = f.limit.clamp(1, MAX_LIMIT);
    let mut out = FlowsRow {
        flows: Vec::new(),
        scanned: 0,
        truncated: false,
    };
    LruPins::open(&view.pin_dir.join(maps::CONNTRACK))?.for_each(|k, v| {
        out.scanned += 1;
        let Some(r) = row(view, "conntrack", k, v, f) else {
            return true;
        };
        if out.flows.len() == limit {
            out.truncated = true;
            return false;
        }
        out.flows.push(r);
        true
    })?;
    let mut cached = Vec::new();
    FlowCachePins::open(&view.pin_dir)?.for_each(|k, v| {
        let Some(r) = row(view, "cache", &k, &v, f) else {
            return true;
        };
        if cached.len() == limit {
            out.truncated = true;
            return false;
        }
        cached.push(r);
        true
    })?;
    out.flows.extend(cached);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_names() {
        let mut view = FlowsView::default();
        view.slots
            .insert(7, ("api".into(), "10.0.0.21".parse().unwrap(), 3));
        let k = FlowKey {
            src: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dst: [10, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            sport: 40000,
            dport: 6443,
            proto: 6,
            family: FAMILY_V4,
            _pad: [0; 2],
        };
        let all = FlowFilter::default();
        let r = row(
            &view,
            "conntrack",
            &k,
            &FlowValue {
                backend_id: 7,
                epoch: 3,
            },
            &all,
        )
        .unwrap();
        assert_eq!(r.client, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(r.vip, "10.0.0.100".parse::<IpAddr>().unwrap());
        assert_eq!(r.backend, Some("10.0.0.21".parse().unwrap()));
        assert!(r.current);
        let stale = row(
            &view,
            "conntrack",
            &k,
            &FlowValue {
                backend_id: 7,
                epoch: 2,
            },
            &all,
        );
        assert!(!stale.unwrap().current, "an older epoch is stale");
        let other_vip = FlowFilter {
            vip: Some("10.0.0.101".parse().unwrap()),
            ..Default::default()
        };
        assert!(row(&view, "conntrack", &k, &FlowValue::default(), &other_vip).is_none());
        let this_client = FlowFilter {
            client: Some("10.0.0.1".parse().unwrap()),
            client_port: Some(40000),
            port: Some(6443),
            ..Default::default()
        };
        assert!(row(&view, "conntrack", &k, &FlowValue::default(), &this_client).is_some());
    }
}
