//! What the sync decides (pure): which connection-table entries are exceptions (their backend
//! is not the one the live Maglev table gives their slot, so another node could not find it
//! by hashing), and where a peer's record goes in this node's table.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use lb_common::{ALL_PORTS, FlowKey, FlowValue, VipKey, flow_hash};

use super::wire::{Close, MAX_CLOSE_AGE_MS, Record};

/// One (service, backend) pair as installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub addr: IpAddr,
    pub id: u32,
    pub epoch: u32,
    pub in_set: bool,
    /// Earlier slots of the pair (addressing changes) that entries may still name.
    pub aliases: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub key: VipKey,
    /// This node forwards it now: only its entries are this node's to share.
    pub owned: bool,
    /// The live Maglev table (backend ids by slot).
    pub table: Arc<Vec<u32>>,
    pub pairs: Vec<Pair>,
    /// Its entries on their slot are shared too: its table may differ from a peer's now. A
    /// backend of it climbs through slow start here (each node steps on its own clock from
    /// when its own checks saw the backend back, and a restarted lbd gives a backend it finds
    /// serving its full weight), or its table changed a short while ago (the nodes' checks see
    /// a change at different times). A flow on its slot here may be off it at the node that
    /// forwards it next.
    pub share_all: bool,
}

/// The data plane's services as the owner last applied them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub hash_seed: u32,
    pub services: Vec<Service>,
}

/// How long a service's entries on their slot are shared after its table changed here: longer
/// than the nodes' health checks take to agree on a change at their default intervals (each
/// node checks on its own), so that a flow placed here meanwhile is not on another slot at a
/// peer that has not seen the change yet.
pub const SHARE_AFTER_CHANGE: Duration = Duration::from_secs(10);

/// When each service's table last changed here (pure: the sync task keeps one and marks each
/// view it scans).
#[derive(Debug, Default)]
pub struct Changes {
    seen: HashMap<VipKey, (Arc<Vec<u32>>, Instant)>,
}

impl Changes {
    /// Note the tables of `view` at `now` and set `share_all` on each service whose table
    /// changed (or appeared) less than [`SHARE_AFTER_CHANGE`] ago.
    pub fn mark(&mut self, view: &mut View, now: Instant) {
        self.seen
            .retain(|k, _| view.services.iter().any(|s| s.key == *k));
        for s in &mut view.services {
            let e = self
                .seen
                .entry(s.key)
                .or_insert_with(|| (s.table.clone(), now));
            if e.0 != s.table {
                *e = (s.table.clone(), now);
            }
            if now.saturating_duration_since(e.1) < SHARE_AFTER_CHANGE {
                s.share_all = true;
            }
        }
    }
}

/// Why an entry is not an exception.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Skip {
    /// Its pair is gone, out of the set, or not of the flow's service.
    Stale,
    /// Its service is not forwarded here (not this node's to share).
    NotForwarded,
    /// The live table gives its slot its own pair: any node finds it.
    OnSlot,
}

/// Why a received record was not installed.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Refused {
    /// Its destination is no service configured here.
    NoService,
    /// Its backend is not in that service's set here (unknown, or out of the set).
    NoBackend,
}

/// Index of a [`View`]: pair by backend id (aliases included), service by key.
pub struct Index<'a> {
    view: &'a View,
    by_id: HashMap<u32, (usize, usize)>,
    by_key: HashMap<VipKey, usize>,
}

impl<'a> Index<'a> {
    pub fn new(view: &'a View) -> Index<'a> {
        let mut by_id = HashMap::new();
        let mut by_key = HashMap::new();
        for (s, svc) in view.services.iter().enumerate() {
            by_key.insert(svc.key, s);
            for (p, pair) in svc.pairs.iter().enumerate() {
                by_id.insert(pair.id, (s, p));
                for a in &pair.aliases {
                    by_id.insert(*a, (s, p));
                }
            }
        }
        Index {
            view,
            by_id,
            by_key,
        }
    }

    /// The service a flow belongs to: its port's, else the address's all-ports service (the
    /// program's own lookup order).
    pub fn service_of(&self, key: &FlowKey) -> Option<&'a Service> {
        let mut vk = VipKey {
            addr: key.dst,
            port: key.dport,
            proto: key.proto,
            family: key.family,
        };
        let s = self.by_key.get(&vk).or_else(|| {
            vk.port = ALL_PORTS;
            self.by_key.get(&vk)
        })?;
        Some(&self.view.services[*s])
    }

    /// An entry of this node's table that a peer needs: its pair is good (its epoch, in the
    /// set, of the flow's own service), the service is forwarded here, and the live table
    /// gives its slot another pair. Returns the backend's address.
    pub fn exception(&self, key: &FlowKey, value: &FlowValue) -> Option<IpAddr> {
        self.classify(key, value).ok()
    }

    /// The backend address an entry names (its pair's, whatever its state).
    pub fn backend_addr(&self, value: &FlowValue) -> Option<IpAddr> {
        let (s, p) = *self.by_id.get(&value.backend())?;
        Some(self.view.services[s].pairs[p].addr)
    }

    /// As [`Index::exception`], saying why an entry is not one.
    pub fn classify(&self, key: &FlowKey, value: &FlowValue) -> Result<IpAddr, Skip> {
        // A closed entry is shared too, with its close (`close_of`): after a move the next
        // node applies the same close rule to a SYN on the 5-tuple.
        let (s, p) = *self.by_id.get(&value.backend()).ok_or(Skip::Stale)?;
        let svc = &self.view.services[s];
        let pair = &svc.pairs[p];
        if !pair.in_set || pair.epoch != value.epoch {
            return Err(Skip::Stale);
        }
        if !svc.owned {
            return Err(Skip::NotForwarded);
        }
        if self.service_of(key).map(|x| x.key) != Some(svc.key) || svc.table.is_empty() {
            return Err(Skip::Stale);
        }
        let slot = flow_hash(key, self.view.hash_seed) as usize % svc.table.len();
        if svc.table[slot] == pair.id && !svc.share_all {
            return Err(Skip::OnSlot);
        }
        Ok(pair.addr)
    }

    /// Whether the live table gives the flow's slot the entry's own pair (a shared entry of a
    /// service with `share_all` may be: see [`Index::classify`]).
    pub fn on_its_slot(&self, key: &FlowKey, value: &FlowValue) -> bool {
        let Some(&(s, p)) = self.by_id.get(&value.backend()) else {
            return false;
        };
        let svc = &self.view.services[s];
        !svc.table.is_empty()
            && svc.table[flow_hash(key, self.view.hash_seed) as usize % svc.table.len()]
                == svc.pairs[p].id
    }

    /// Whether this node forwards the flow's service (then its own entries decide, and a
    /// peer's record never replaces one).
    pub fn forwarded(&self, key: &FlowKey) -> bool {
        self.service_of(key).is_some_and(|s| s.owned)
    }

    /// Where a peer's record goes here: its service's pair of that backend address, which
    /// must be in the set.
    pub fn resolve(&self, r: &Record) -> Result<FlowValue, Refused> {
        let svc = self.service_of(&r.key).ok_or(Refused::NoService)?;
        let pair = svc
            .pairs
            .iter()
            .find(|p| p.addr == r.backend && p.in_set)
            .ok_or(Refused::NoBackend)?;
        Ok(FlowValue {
            backend_id: pair.id,
            epoch: pair.epoch,
        })
    }
}

/// The data plane's coarse clock (`bpf_ktime_get_coarse_ns`, `CLOCK_MONOTONIC_COARSE`): a
/// close's time in an entry is on it.
pub fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the kernel writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The close a record carries for `value` (`None`: the client has not closed it), at `now_ns`
/// on the data plane's coarse clock (`CLOCK_MONOTONIC_COARSE`).
pub fn close_of(value: &FlowValue, now_ns: u64) -> Option<Close> {
    value.client_closed().then(|| Close {
        seq: value.close_seq() as u8,
        age_ms: (value.close_age_ns(now_ns) / 1_000_000).min(u64::from(MAX_CLOSE_AGE_MS)) as u32,
    })
}

/// `value` (open) as a record's close leaves it, at `now_ns` on this node's coarse clock: the
/// close's time set back by its age, so the hold runs on from where the sender's stood.
pub fn with_close(value: FlowValue, close: Option<Close>, now_ns: u64) -> FlowValue {
    match close {
        Some(c) => value.closed_aged(u32::from(c.seq), u64::from(c.age_ms) * 1_000_000, now_ns),
        None => value,
    }
}

/// What a peer holds of a shared entry, the close's age aside (it changes with every scan):
/// a change of it is sent again.
pub fn shared_state(backend: IpAddr, close: Option<Close>) -> (IpAddr, Option<u8>) {
    (backend, close.map(|c| c.seq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::{FAMILY_V4, PROTO_TCP};

    fn vip() -> VipKey {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&[10, 0, 0, 100]);
        VipKey {
            addr,
            port: 6443,
            proto: PROTO_TCP,
            family: FAMILY_V4,
        }
    }

    fn flow(i: u16) -> FlowKey {
        let mut src = [0; 16];
        src[..4].copy_from_slice(&[10, 1, (i >> 8) as u8, i as u8]);
        FlowKey {
            src,
            dst: vip().addr,
            sport: 30000 + i,
            dport: 6443,
            proto: PROTO_TCP,
            family: FAMILY_V4,
            _pad: [0; 2],
        }
    }

    /// Table of 7 slots over pairs 1, 2, 3 (1, 2, 3, 1, 2, 3, 1).
    fn view(owned: bool) -> View {
        let pairs = (1..=3)
            .map(|i| Pair {
                addr: format!("10.0.0.{}", 10 + i).parse().unwrap(),
                id: i,
                epoch: 100 + i,
                in_set: true,
                aliases: if i == 2 { vec![9] } else { vec![] },
            })
            .collect();
        View {
            hash_seed: 5,
            services: vec![Service {
                key: vip(),
                owned,
                table: Arc::new(vec![1, 2, 3, 1, 2, 3, 1]),
                pairs,
                share_all: false,
            }],
        }
    }

    fn slot_pair(v: &View, k: &FlowKey) -> u32 {
        let t = &v.services[0].table;
        t[flow_hash(k, v.hash_seed) as usize % t.len()]
    }

    #[test]
    fn only_good_entries_off_their_slot_are_exceptions() {
        let v = view(true);
        let ix = Index::new(&v);
        let mut seen_exception = 0;
        for i in 0..200 {
            let k = flow(i);
            let on = slot_pair(&v, &k);
            for id in 1..=3u32 {
                let got = ix.exception(
                    &k,
                    &FlowValue {
                        backend_id: id,
                        epoch: 100 + id,
                    },
                );
                if id == on {
                    assert_eq!(got, None, "on its slot");
                } else {
                    assert_eq!(got, Some(format!("10.0.0.{}", 10 + id).parse().unwrap()));
                    seen_exception += 1;
                }
                // Another epoch: a stale entry is no one's business.
                assert_eq!(
                    ix.exception(
                        &k,
                        &FlowValue {
                            backend_id: id,
                            epoch: 1
                        }
                    ),
                    None
                );
            }
        }
        assert!(seen_exception > 0);
        // An alias of pair 2 counts as pair 2.
        let k = (0..200).map(flow).find(|k| slot_pair(&v, k) != 2).unwrap();
        assert!(
            ix.exception(
                &k,
                &FlowValue {
                    backend_id: 9,
                    epoch: 102
                }
            )
            .is_some()
        );
        // A flow to another port is not this service's.
        let mut other = k;
        other.dport = 80;
        assert_eq!(
            ix.exception(
                &other,
                &FlowValue {
                    backend_id: 1,
                    epoch: 101
                }
            ),
            None
        );
    }

    #[test]
    fn a_service_whose_table_may_differ_shares_its_entries_on_their_slot_too() {
        let mut v = view(true);
        v.services[0].share_all = true;
        let ix = Index::new(&v);
        for i in 0..200 {
            let k = flow(i);
            let on = slot_pair(&v, &k);
            let value = FlowValue {
                backend_id: on,
                epoch: 100 + on,
            };
            assert_eq!(
                ix.classify(&k, &value),
                Ok(format!("10.0.0.{}", 10 + on).parse().unwrap())
            );
            assert!(ix.on_its_slot(&k, &value));
            // Stale entries stay unshared.
            let stale = FlowValue { epoch: 1, ..value };
            assert_eq!(ix.classify(&k, &stale), Err(Skip::Stale));
        }
        // Not forwarded here: still nothing.
        v.services[0].owned = false;
        let ix = Index::new(&v);
        let k = flow(1);
        let on = slot_pair(&v, &k);
        let value = FlowValue {
            backend_id: on,
            epoch: 100 + on,
        };
        assert_eq!(ix.classify(&k, &value), Err(Skip::NotForwarded));
    }

    #[test]
    fn a_table_change_shares_everything_for_a_while() {
        let t0 = Instant::now();
        let mut changes = Changes::default();
        let marked = |c: &mut Changes, v: &View, at: Instant| {
            let mut v = v.clone();
            c.mark(&mut v, at);
            v.services[0].share_all
        };
        let mut v = view(true);
        // New here: it may differ.
        assert!(marked(&mut changes, &v, t0));
        let later = t0 + SHARE_AFTER_CHANGE;
        assert!(!marked(&mut changes, &v, later));
        // Its table changes: shared again, until the same time has passed.
        v.services[0].table = Arc::new(vec![1, 1, 3, 1, 2, 3, 1]);
        assert!(marked(&mut changes, &v, later));
        assert!(marked(
            &mut changes,
            &v,
            later + SHARE_AFTER_CHANGE - Duration::from_millis(1)
        ));
        assert!(!marked(&mut changes, &v, later + SHARE_AFTER_CHANGE));
        // Climbing (set by the data plane) stays shared whatever the time.
        v.services[0].share_all = true;
        assert!(marked(&mut changes, &v, later + SHARE_AFTER_CHANGE * 3));
    }

    #[test]
    fn a_service_not_forwarded_here_shares_nothing() {
        let v = view(false);
        let ix = Index::new(&v);
        for i in 0..50 {
            for id in 1..=3u32 {
                assert_eq!(
                    ix.exception(
                        &flow(i),
                        &FlowValue {
                            backend_id: id,
                            epoch: 100 + id
                        }
                    ),
                    None
                );
            }
        }
    }

    /// A closed entry is shared with its close, and a peer's copy is closed with the same end
    /// bits and a hold that runs on from the sender's (the data plane's rule then applies).
    #[test]
    fn a_closed_entry_travels_closed_and_keeps_its_hold() {
        let unit = 1u64 << lb_common::FLOW_CLOSE_TIME_UNIT;
        let v = view(true);
        let ix = Index::new(&v);
        let k = (0..200).map(flow).find(|k| slot_pair(&v, k) != 1).unwrap();
        let open = FlowValue {
            backend_id: 1,
            epoch: 101,
        };
        let closed_at = 100 * unit + 5;
        let closed = open.closed_at(0x1234_5678, closed_at);
        // Still an exception (its pair is good): shared, with its close.
        assert!(ix.exception(&k, &closed).is_some());
        assert_eq!(close_of(&open, closed_at), None);
        let sent_at = closed_at + 2 * unit;
        let c = close_of(&closed, sent_at).unwrap();
        assert_eq!(u32::from(c.seq), 0x78 & 0x7f);
        assert_eq!(u64::from(c.age_ms), (2 * unit + 5) / 1_000_000);
        // The age does not change what a peer holds; the close does.
        assert_eq!(
            shared_state("10.0.0.11".parse().unwrap(), Some(c)),
            shared_state(
                "10.0.0.11".parse().unwrap(),
                close_of(&closed, sent_at + unit)
            )
        );
        assert_ne!(
            shared_state("10.0.0.11".parse().unwrap(), Some(c)),
            shared_state("10.0.0.11".parse().unwrap(), None)
        );
        // The peer (another clock) installs it closed, not yet held; held within a unit of
        // where the sender's would be.
        let peer = view(false);
        let pix = Index::new(&peer);
        let r = Record {
            key: k,
            backend: "10.0.0.11".parse().unwrap(),
            close: Some(c),
        };
        let peer_now = 7_000 * unit + 12_345;
        let got = with_close(pix.resolve(&r).unwrap(), r.close, peer_now);
        assert!(got.client_closed() && got.close_matches(0x1234_5678));
        assert_eq!((got.backend(), got.epoch), (1, 101));
        assert!(!got.close_held(peer_now));
        assert!(!got.close_held(peer_now + unit));
        assert!(got.close_held(peer_now + 3 * unit));
        // An open record installs an open entry.
        let r = Record { close: None, ..r };
        assert_eq!(
            with_close(pix.resolve(&r).unwrap(), r.close, peer_now),
            open
        );
    }

    #[test]
    fn records_resolve_to_this_nodes_pair_by_address() {
        // The peer's ids and epochs differ; the address decides.
        let mut v = view(false);
        for p in &mut v.services[0].pairs {
            p.id += 40;
            p.epoch += 1000;
        }
        let ix = Index::new(&v);
        let r = Record {
            key: flow(1),
            backend: "10.0.0.12".parse().unwrap(),
            close: None,
        };
        assert_eq!(
            ix.resolve(&r),
            Ok(FlowValue {
                backend_id: 42,
                epoch: 1102
            })
        );
        let mut unknown = r;
        unknown.backend = "10.0.0.99".parse().unwrap();
        assert_eq!(ix.resolve(&unknown), Err(Refused::NoBackend));
        let mut other = r;
        other.key.dport = 22;
        assert_eq!(ix.resolve(&other), Err(Refused::NoService));
        v.services[0].pairs[1].in_set = false;
        let ix = Index::new(&v);
        assert_eq!(ix.resolve(&r), Err(Refused::NoBackend));
    }
}
