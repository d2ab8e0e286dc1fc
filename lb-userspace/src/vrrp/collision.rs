//! VRID collision detection (pure).
//!
//! An advert on our VRID whose virtual address set or authentication differs from ours most
//! likely comes from another cluster that derived the same VRID (OpenShift has only ~225). It is
//! recorded and reported, never acted on here: the state machine's behaviour does not change, so
//! a collision cannot make us flap. (Adverts with different auth are dropped by the codec's
//! checks anyway; those with a different VIP set still take part in the election, as RFC 9568
//! and keepalived do.)

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use super::codec::{Advert, Auth};

/// Peers tracked in detail; more distinct sources (e.g. spoofed) are only counted.
pub const MAX_TRACKED_PEERS: usize = 16;

/// What differed between a peer's advert and our configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Mismatch {
    pub vips: bool,
    pub auth: bool,
}

impl Mismatch {
    pub fn any(self) -> bool {
        self.vips || self.auth
    }

    pub fn describe(self) -> &'static str {
        match (self.vips, self.auth) {
            (true, true) => "vips+auth",
            (true, false) => "vips",
            (false, true) => "auth",
            (false, false) => "none",
        }
    }
}

/// Compare an advert for our VRID with our VIP set and auth. The VIP comparison ignores order
/// and duplicates. Auth is compared for VRRPv2 only (v3 has none).
pub fn compare(advert: &Advert, our_vips: &[IpAddr], our_auth: &Auth) -> Mismatch {
    let mut theirs: Vec<IpAddr> = advert.addrs.clone();
    theirs.sort();
    theirs.dedup();
    let mut ours: Vec<IpAddr> = our_vips.to_vec();
    ours.sort();
    ours.dedup();
    Mismatch {
        vips: theirs != ours,
        auth: advert.version == super::codec::Version::V2 && advert.auth != *our_auth,
    }
}

/// One colliding peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Collision {
    pub peer: IpAddr,
    /// What differed the last time.
    pub differs: Mismatch,
    /// The peer's VIPs as last seen (never its password).
    pub their_vips: Vec<IpAddr>,
    pub count: u64,
    /// Unix time in milliseconds (supplied by the caller).
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
}

/// The collisions one instance has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Collisions {
    pub peers: BTreeMap<IpAddr, Collision>,
    /// Collisions from sources beyond [`MAX_TRACKED_PEERS`].
    pub untracked: u64,
}

impl Collisions {
    /// Total number of colliding adverts seen.
    pub fn total(&self) -> u64 {
        self.peers.values().map(|c| c.count).sum::<u64>() + self.untracked
    }

    /// Record an advert from `peer` if it collides. Returns `true` the first time a peer is
    /// seen colliding, or when what differs changes, so the caller logs once, not per advert.
    pub fn observe(
        &mut self,
        peer: IpAddr,
        advert: &Advert,
        differs: Mismatch,
        now_ms: u64,
    ) -> bool {
        if !differs.any() {
            return false;
        }
        if let Some(c) = self.peers.get_mut(&peer) {
            let changed = c.differs != differs || c.their_vips != advert.addrs;
            c.count += 1;
            c.last_seen_ms = now_ms;
            c.differs = differs;
            c.their_vips.clone_from(&advert.addrs);
            return changed;
        }
        if self.peers.len() >= MAX_TRACKED_PEERS {
            self.untracked += 1;
            return false;
        }
        self.peers.insert(
            peer,
            Collision {
                peer,
                differs,
                their_vips: advert.addrs.clone(),
                count: 1,
                first_seen_ms: now_ms,
                last_seen_ms: now_ms,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::Version;
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn advert(version: Version, addrs: &[&str], auth: Auth) -> Advert {
        Advert {
            version,
            vrid: 7,
            priority: 100,
            interval_cs: 100,
            addrs: addrs.iter().map(|a| ip(a)).collect(),
            auth,
        }
    }

    #[test]
    fn compare_ignores_order_and_detects_differences() {
        let ours = [ip("192.0.2.1"), ip("192.0.2.2")];
        let pass = Auth::simple("secret");
        let same = advert(Version::V2, &["192.0.2.2", "192.0.2.1"], pass);
        assert!(!compare(&same, &ours, &pass).any());
        let other_vip = advert(Version::V2, &["192.0.2.9"], pass);
        assert_eq!(compare(&other_vip, &ours, &pass).describe(), "vips");
        let other_auth = advert(Version::V2, &["192.0.2.1", "192.0.2.2"], Auth::simple("x"));
        assert_eq!(compare(&other_auth, &ours, &pass).describe(), "auth");
        // v3 has no auth, so only the VIPs count.
        let v3 = advert(Version::V3, &["192.0.2.1", "192.0.2.2"], Auth::None);
        assert!(!compare(&v3, &ours, &pass).any());
    }

    #[test]
    fn records_once_and_counts() {
        let ours = [ip("192.0.2.1")];
        let mut c = Collisions::default();
        let a = advert(Version::V3, &["192.0.2.50"], Auth::None);
        let d = compare(&a, &ours, &Auth::None);
        assert!(c.observe(ip("192.0.2.77"), &a, d, 1000));
        assert!(!c.observe(ip("192.0.2.77"), &a, d, 2000));
        let rec = &c.peers[&ip("192.0.2.77")];
        assert_eq!(
            (rec.count, rec.first_seen_ms, rec.last_seen_ms),
            (2, 1000, 2000)
        );
        assert_eq!(rec.their_vips, vec![ip("192.0.2.50")]);
        // A change in what the peer announces is worth a new log line.
        let b = advert(Version::V3, &["192.0.2.51"], Auth::None);
        assert!(c.observe(ip("192.0.2.77"), &b, compare(&b, &ours, &Auth::None), 3000));
        // A matching advert is not a collision.
        let ok = advert(Version::V3, &["192.0.2.1"], Auth::None);
        assert!(!c.observe(
            ip("192.0.2.78"),
            &ok,
            compare(&ok, &ours, &Auth::None),
            3000
        ));
        assert_eq!(c.total(), 3);
    }

    #[test]
    fn bounded_number_of_peers() {
        let mut c = Collisions::default();
        let a = advert(Version::V3, &["192.0.2.50"], Auth::None);
        let d = Mismatch {
            vips: true,
            auth: false,
        };
        for i in 0..40u8 {
            c.observe(IpAddr::from([10, 0, 0, i]), &a, d, 0);
        }
        assert_eq!(c.peers.len(), MAX_TRACKED_PEERS);
        assert_eq!(c.untracked, 40 - MAX_TRACKED_PEERS as u64);
        assert_eq!(c.total(), 40);
    }
}
