//! Who has announced itself (pure): the learned members, and the peers they add to this node's
//! VRRP instances and connection sync, on top of the rendered lists (the floor).

use std::{collections::BTreeMap, net::IpAddr};

use super::wire::{Announcement, F_LEAVING, F_SYNC, Instance};

/// A node heard from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub instances: Vec<Instance>,
    pub sync: bool,
    /// When it was last heard (this node's clock, microseconds).
    pub heard_us: u64,
}

/// What an announcement changed.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard {
    /// A node not known before, or one whose instances or sync changed.
    Changed,
    /// Known, nothing changed (only its time).
    Same,
    /// It said it is stopping, and it was a member.
    Left,
    /// It said it is stopping and was not a member.
    Nothing,
}

/// The learned members, by the source address of their datagrams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    members: BTreeMap<IpAddr, Member>,
}

impl Roster {
    /// An authentic, fresh announcement from `from` (the caller checked tag and replay).
    pub fn heard(&mut self, from: IpAddr, a: &Announcement, now_us: u64) -> Heard {
        if a.flags & F_LEAVING != 0 {
            return if self.members.remove(&from).is_some() {
                Heard::Left
            } else {
                Heard::Nothing
            };
        }
        let mut instances = a.instances.clone();
        instances.sort();
        instances.dedup();
        let m = Member {
            instances,
            sync: a.flags & F_SYNC != 0,
            heard_us: now_us,
        };
        match self.members.insert(from, m.clone()) {
            Some(old) if old.instances == m.instances && old.sync == m.sync => Heard::Same,
            _ => Heard::Changed,
        }
    }

    /// Forget the members silent for longer than `expire_us`; returns whether any went.
    pub fn expire(&mut self, now_us: u64, expire_us: u64) -> bool {
        let before = self.members.len();
        self.members
            .retain(|_, m| now_us.saturating_sub(m.heard_us) <= expire_us);
        self.members.len() != before
    }

    pub fn contains(&self, from: &IpAddr) -> bool {
        self.members.contains_key(from)
    }

    /// Where the members' datagrams come from (where announcements go).
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.members.keys().copied().collect()
    }

    /// The learned peers of this node's instance `vrid` whose source address is `src`: the
    /// members' addresses in an instance of the same VRID and family.
    pub fn peers_for(&self, vrid: u8, src: IpAddr) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = self
            .members
            .values()
            .flat_map(|m| m.instances.iter())
            .filter(|i| i.vrid == vrid && i.addr.is_ipv4() == src.is_ipv4() && i.addr != src)
            .map(|i| i.addr)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The learned sync peers of a node whose instances have the VRIDs `vrids`: members that
    /// sync and share one of them (they may forward one of its VIPs next).
    pub fn sync_peers(&self, vrids: &[u8]) -> Vec<IpAddr> {
        self.members
            .iter()
            .filter(|(_, m)| m.sync && m.instances.iter().any(|i| vrids.contains(&i.vrid)))
            .map(|(a, _)| *a)
            .collect()
    }

    /// Whether the members include `from` with sync (for a test's eyes and the status).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// The floor (rendered list) and the learned peers together, in the floor's order, then the
/// learned ones; never `me`.
pub fn merge(floor: &[IpAddr], learned: &[IpAddr], me: Option<IpAddr>) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = floor.to_vec();
    for a in learned {
        if !v.contains(a) && Some(*a) != me {
            v.push(*a);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::wire::F_HELLO;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ann(flags: u8, inst: &[(u8, &str)]) -> Announcement {
        Announcement {
            stamp: 0,
            flags,
            instances: inst
                .iter()
                .map(|(vrid, a)| Instance {
                    vrid: *vrid,
                    addr: ip(a),
                })
                .collect(),
        }
    }

    #[test]
    fn a_joining_node_becomes_a_peer_of_the_instances_it_shares_and_leaves_when_it_says_so() {
        let mut r = Roster::default();
        let n4 = ip("10.0.0.14");
        let a = ann(
            F_SYNC | F_HELLO,
            &[(14, "10.0.0.14"), (93, "10.0.0.14"), (14, "fd00::14")],
        );
        assert_eq!(r.heard(n4, &a, 1_000), Heard::Changed);
        assert_eq!(r.heard(n4, &a, 2_000), Heard::Same);
        // The v4 API instance of this node (VRID 14, source 10.0.0.11) gets the v4 address only.
        assert_eq!(r.peers_for(14, ip("10.0.0.11")), vec![n4]);
        assert_eq!(r.peers_for(14, ip("fd00::11")), vec![ip("fd00::14")]);
        assert!(
            r.peers_for(15, ip("10.0.0.11")).is_empty(),
            "another VRID: not a peer"
        );
        assert_eq!(r.sync_peers(&[93]), vec![n4]);
        assert!(
            r.sync_peers(&[7]).is_empty(),
            "shares no VRID: not a sync peer"
        );
        assert_eq!(
            merge(
                &[ip("10.0.0.12")],
                &r.peers_for(14, ip("10.0.0.11")),
                Some(ip("10.0.0.11"))
            ),
            vec![ip("10.0.0.12"), n4]
        );
        // Without sync it stays a VRRP peer and is no sync peer.
        assert_eq!(
            r.heard(n4, &ann(0, &[(14, "10.0.0.14")]), 3_000),
            Heard::Changed
        );
        assert!(r.sync_peers(&[14]).is_empty());
        assert_eq!(r.heard(n4, &ann(F_LEAVING, &[]), 4_000), Heard::Left);
        assert!(r.peers_for(14, ip("10.0.0.11")).is_empty());
        assert_eq!(r.heard(n4, &ann(F_LEAVING, &[]), 5_000), Heard::Nothing);
    }

    #[test]
    fn a_silent_member_expires() {
        let mut r = Roster::default();
        r.heard(ip("10.0.0.14"), &ann(0, &[(14, "10.0.0.14")]), 1_000_000);
        r.heard(ip("10.0.0.15"), &ann(0, &[(14, "10.0.0.15")]), 20_000_000);
        assert!(!r.expire(25_000_000, 30_000_000));
        assert!(r.expire(32_000_000, 30_000_000));
        assert_eq!(r.addresses(), vec![ip("10.0.0.15")]);
    }
}
