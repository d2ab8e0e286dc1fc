//! What the data plane should hold, as plain values: `plan` computes a [`Desired`] from the
//! config and the facts, and `dataplane` (the only writer of the maps) makes the maps say it.
//! Pure, and apart from `dataplane` so that `plan` is pure logic that builds and tests without
//! the module that owns aya.

use std::net::IpAddr;

use lb_common::{FAMILY_V4, FAMILY_V6, VipKey};

/// What `lbd` wants the data plane to do, recomputed from config, health, neighbours and VRRP.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    pub services: Vec<ServiceSpec>,
    /// MACs of the other lbd nodes (VRRP peers, backends): the loop guard passes VIP packets
    /// from them to the local stack instead of forwarding them again.
    pub peers: Vec<[u8; 6]>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServiceSpec {
    pub key: VipKey,
    pub owned: bool,
    pub backends: Vec<BackendSpec>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BackendSpec {
    pub addr: IpAddr,
    pub weight: u32,
    /// Where to send frames; `None` when the MAC is not resolved yet (then not in the set).
    pub mac: Option<[u8; 6]>,
    /// Source MAC of the egress interface.
    pub src_mac: [u8; 6],
    /// 0 = the XDP interface itself (XDP_TX), else redirect to this interface.
    pub ifindex: u32,
    /// The backend is this node (its traffic goes to the local stack).
    pub local: bool,
    /// In the set by health: a backend out of it has its established flows moved.
    pub healthy: bool,
    /// Drained: no new flows, established ones stay.
    pub drained: bool,
    /// Failing its checks (or its node suspected dead) but still within the hold during which
    /// its established flows stay (see `plan`): no new flows. Not persisted in the maps.
    pub failing: bool,
    /// A routed backend reached by IP-in-IP (`mac` is then the next hop's).
    pub encap: Option<Encap>,
    /// Slow start: its Maglev weight is `weight * step / SLOW_START_STEPS` (`SLOW_START_STEPS`:
    /// full). Each step moves some slots to it; the flows that started on those slots before
    /// stay where they are through their connection-table entries (and, on the peers, the
    /// sync's exceptions).
    pub step: u32,
}

/// How a routed backend's packets are wrapped (see `lb_common::BACKEND_F_ENCAP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Encap {
    /// The outer source: this node's address on the path to the backend.
    pub src: IpAddr,
    /// The egress MTU: larger wrapped packets get an ICMP too-big back.
    pub mtu: u16,
}

impl BackendSpec {
    /// Whether `other` can be installed over this pair's slot in place: only the flags may
    /// differ (health, drain, weight); addressing is written once per slot (a change moves the
    /// pair to a new slot: `Dataplane::move_pair`).
    pub fn same_pair(&self, other: &BackendSpec) -> bool {
        self.mac == other.mac
            && self.src_mac == other.src_mac
            && self.ifindex == other.ifindex
            && self.local == other.local
            && self.encap == other.encap
    }
    /// May keep established flows.
    pub fn in_set(&self) -> bool {
        self.healthy && (self.local || self.mac.is_some())
    }
    /// May receive new flows.
    pub fn in_table(&self) -> bool {
        self.in_set() && !self.drained && !self.failing && self.weight > 0
    }
}

pub fn vip_key(addr: IpAddr, port: u16, proto: u8) -> VipKey {
    let (bytes, family) = addr_bytes(addr);
    VipKey {
        addr: bytes,
        port,
        proto,
        family,
    }
}

pub fn addr_bytes(addr: IpAddr) -> ([u8; 16], u8) {
    let mut b = [0u8; 16];
    match addr {
        IpAddr::V4(a) => {
            b[..4].copy_from_slice(&a.octets());
            (b, FAMILY_V4)
        }
        IpAddr::V6(a) => (a.octets(), FAMILY_V6),
    }
}

pub fn key_addr(addr: &[u8; 16], family: u8) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::from([addr[0], addr[1], addr[2], addr[3]])
    } else {
        IpAddr::from(*addr)
    }
}
