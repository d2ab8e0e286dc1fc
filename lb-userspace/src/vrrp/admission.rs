//! Who may vote in our election (pure): every received advert for our VRID is judged here
//! before the state machine sees it.
//!
//! An advert votes only if it is for our VRID, arrives in our mode (multicast or unicast), comes
//! from one of our `unicast_peers` on a unicast instance (keepalived's `check_unicast_src`),
//! has our version (or VRRPv2 while `v2_compat` migrates), our v2 auth and interval, and
//! carries exactly our VIP set. Anything else is dropped with a reason. A different VIP set or
//! password on our VRID is also a collision (another cluster derived the same VRID): reported,
//! never a vote, so a foreign router cannot take our VIP away, whatever priority it claims.

use std::net::IpAddr;

use super::codec::{Advert, Auth, DecodeError, Version};
use super::collision::{self, Mismatch};

/// What an instance accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub version: Version,
    pub vrid: u8,
    /// Our interval in centiseconds (VRRPv2 adverts must match it).
    pub interval_cs: u16,
    /// Our VRRPv2 authentication.
    pub auth: Auth,
    /// Our VIPs, sorted and without duplicates.
    pub vips: Vec<IpAddr>,
    /// Empty: a multicast instance.
    pub unicast_peers: Vec<IpAddr>,
    /// Unicast instance: accept adverts only from `unicast_peers`.
    pub check_unicast_src: bool,
    /// A VRRPv3 instance that also accepts VRRPv2 adverts (a version migration).
    pub accept_v2: bool,
    /// IPv6 unicast: the hop limits each listed peer's adverts may arrive with (keepalived's
    /// per-peer `min_ttl` / `max_ttl`). The socket layer already demands 255 of everything
    /// else.
    pub peer_hops: Vec<(IpAddr, std::ops::RangeInclusive<u8>)>,
}

/// The verdict on one advert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judgement {
    /// `Ok`: the advert votes; otherwise why it was dropped.
    pub verdict: Result<(), DecodeError>,
    /// A collision to record (our VRID, other VIPs or password).
    pub collision: Option<Mismatch>,
    /// The sender claims to be master of at least one of our VIPs (priority above 0): if we
    /// are master too, that is a dual-master episode in the making.
    pub claims_our_vips: bool,
}

impl Policy {
    pub fn new(
        version: Version,
        vrid: u8,
        interval_cs: u16,
        auth: Auth,
        vips: &[IpAddr],
        unicast_peers: &[IpAddr],
    ) -> Policy {
        let mut vips = vips.to_vec();
        vips.sort();
        vips.dedup();
        Policy {
            version,
            vrid,
            interval_cs,
            auth,
            vips,
            unicast_peers: unicast_peers.to_vec(),
            check_unicast_src: true,
            accept_v2: false,
            peer_hops: Vec::new(),
        }
    }

    /// Whether judgement `j` is evidence of a second master (see [`super::split_brain`]): the
    /// advert claims our VIPs and was admitted, or it comes from one of our checked unicast
    /// peers and differs only in version, password or interval (a migration half done: a real
    /// second master that cannot hear us). Never a stranger's or a forged source's advert, so
    /// neither the count nor the log grows with what an attacker sends.
    pub fn split_brain_evidence(&self, j: &Judgement) -> bool {
        j.claims_our_vips
            && match j.verdict {
                Ok(()) => true,
                Err(
                    DecodeError::WrongVersion | DecodeError::WrongAuth | DecodeError::WrongInterval,
                ) => !self.multicast() && self.check_unicast_src,
                Err(_) => false,
            }
    }

    /// Whether an advert from `src` to `dst` that arrived with hop limit `hops` is within the
    /// sender's configured bounds (only IPv6 unicast adverts have bounds; see `io::ttl_ok`).
    pub fn hops_ok(&self, src: IpAddr, dst: IpAddr, hops: u8) -> bool {
        if dst.is_multicast() || src.is_ipv4() {
            return true;
        }
        self.peer_hops
            .iter()
            .find(|(p, _)| *p == src)
            .is_none_or(|(_, r)| r.contains(&hops))
    }

    fn multicast(&self) -> bool {
        self.unicast_peers.is_empty()
    }

    /// Judge `advert`, received from `src` addressed to `dst`.
    pub fn judge(&self, src: IpAddr, dst: IpAddr, advert: &Advert) -> Judgement {
        let claims = advert.priority > 0 && advert.addrs.iter().any(|a| self.vips.contains(a));
        let drop = |reason, collision| Judgement {
            verdict: Err(reason),
            collision,
            claims_our_vips: claims,
        };
        if advert.vrid != self.vrid {
            return Judgement {
                verdict: Err(DecodeError::OtherVrid),
                collision: None,
                claims_our_vips: false,
            };
        }
        if dst.is_multicast() != self.multicast() {
            return drop(DecodeError::WrongMode, None);
        }
        if !self.multicast() && self.check_unicast_src && !self.unicast_peers.contains(&src) {
            return drop(DecodeError::NotAPeer, None);
        }
        let differs = collision::compare(advert, &self.vips, &self.auth);
        let version_ok =
            advert.version == self.version || (self.accept_v2 && advert.version == Version::V2);
        if !version_ok {
            return drop(DecodeError::WrongVersion, None);
        }
        if advert.version == Version::V2 {
            if advert.auth != self.auth {
                return drop(DecodeError::WrongAuth, Some(differs));
            }
            if advert.interval_cs != self.interval_cs {
                return drop(DecodeError::WrongInterval, None);
            }
        }
        if advert.addrs.is_empty() {
            return drop(DecodeError::NoAddresses, None);
        }
        if differs.vips {
            return drop(DecodeError::OtherVips, Some(differs));
        }
        Judgement {
            verdict: Ok(()),
            collision: None,
            claims_our_vips: claims,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vrrp::codec::{MCAST_V4, MCAST_V6};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn advert(priority: u8, addrs: &[&str]) -> Advert {
        Advert {
            version: Version::V3,
            vrid: 51,
            priority,
            interval_cs: 10,
            addrs: addrs.iter().map(|a| ip(a)).collect(),
            auth: Auth::None,
        }
    }

    fn multicast() -> Policy {
        Policy::new(
            Version::V3,
            51,
            10,
            Auth::None,
            &[ip("10.0.0.100"), ip("10.0.0.101")],
            &[],
        )
    }

    fn unicast() -> Policy {
        Policy::new(
            Version::V3,
            51,
            10,
            Auth::None,
            &[ip("10.0.0.100")],
            &[ip("10.0.0.12"), ip("10.0.0.13")],
        )
    }

    const MC: IpAddr = IpAddr::V4(MCAST_V4);

    #[test]
    fn our_vip_set_in_any_order_votes() {
        let p = multicast();
        let j = p.judge(
            ip("10.0.0.12"),
            MC,
            &advert(100, &["10.0.0.101", "10.0.0.100"]),
        );
        assert_eq!(j.verdict, Ok(()));
        assert!(j.claims_our_vips);
        assert_eq!(j.collision, None);
    }

    #[test]
    fn another_vip_set_is_a_collision_and_never_votes() {
        let p = multicast();
        for addrs in [
            &["10.9.9.9"][..],
            &["10.0.0.100"][..],
            &["10.0.0.100", "10.0.0.101", "10.0.0.102"][..],
        ] {
            let j = p.judge(ip("10.0.0.99"), MC, &advert(255, addrs));
            assert_eq!(j.verdict, Err(DecodeError::OtherVips), "{addrs:?}");
            assert!(j.collision.unwrap().vips);
        }
        // A foreign set that overlaps ours claims our VIP; a disjoint one does not.
        assert!(
            p.judge(ip("10.0.0.99"), MC, &advert(255, &["10.0.0.100"]))
                .claims_our_vips
        );
        assert!(
            !p.judge(ip("10.0.0.99"), MC, &advert(255, &["10.9.9.9"]))
                .claims_our_vips
        );
    }

    #[test]
    fn an_address_count_of_zero_is_dropped() {
        let j = multicast().judge(ip("10.0.0.12"), MC, &advert(255, &[]));
        assert_eq!(j.verdict, Err(DecodeError::NoAddresses));
        assert!(!j.claims_our_vips);
    }

    #[test]
    fn unicast_accepts_only_its_peers() {
        let p = unicast();
        let me = ip("10.0.0.11");
        let ok = p.judge(ip("10.0.0.12"), me, &advert(100, &["10.0.0.100"]));
        assert_eq!(ok.verdict, Ok(()));
        let stranger = p.judge(ip("10.0.0.99"), me, &advert(255, &["10.0.0.100"]));
        assert_eq!(stranger.verdict, Err(DecodeError::NotAPeer));
        assert!(stranger.claims_our_vips);
        // With the check off (keepalived's default), anyone with our VIPs votes.
        let open = Policy {
            check_unicast_src: false,
            ..unicast()
        };
        assert_eq!(
            open.judge(ip("10.0.0.99"), me, &advert(255, &["10.0.0.100"]))
                .verdict,
            Ok(())
        );
    }

    #[test]
    fn the_other_mode_is_dropped() {
        // Multicast advert on a unicast instance, even from a peer.
        let j = unicast().judge(ip("10.0.0.12"), MC, &advert(100, &["10.0.0.100"]));
        assert_eq!(j.verdict, Err(DecodeError::WrongMode));
        // Unicast advert on a multicast instance.
        let j = multicast().judge(
            ip("10.0.0.12"),
            ip("10.0.0.11"),
            &advert(100, &["10.0.0.100", "10.0.0.101"]),
        );
        assert_eq!(j.verdict, Err(DecodeError::WrongMode));
        // IPv6 multicast group counts as multicast.
        let p6 = Policy::new(Version::V3, 51, 10, Auth::None, &[ip("fd00::100")], &[]);
        let mut a = advert(100, &["fd00::100"]);
        a.addrs = vec![ip("fd00::100")];
        assert_eq!(
            p6.judge(ip("fe80::2"), IpAddr::V6(MCAST_V6), &a).verdict,
            Ok(())
        );
    }

    #[test]
    fn v2_auth_interval_and_version() {
        let pass = Auth::simple("ostest_a");
        let p = Policy::new(Version::V2, 51, 100, pass, &[ip("10.0.0.100")], &[]);
        let mut a = advert(100, &["10.0.0.100"]);
        a.version = Version::V2;
        a.interval_cs = 100;
        a.auth = pass;
        assert_eq!(p.judge(ip("10.0.0.12"), MC, &a).verdict, Ok(()));
        let wrong_pass = Advert {
            auth: Auth::simple("other"),
            ..a.clone()
        };
        let j = p.judge(ip("10.0.0.12"), MC, &wrong_pass);
        assert_eq!(j.verdict, Err(DecodeError::WrongAuth));
        assert!(j.collision.unwrap().auth);
        let slow = Advert {
            interval_cs: 200,
            ..a.clone()
        };
        assert_eq!(
            p.judge(ip("10.0.0.12"), MC, &slow).verdict,
            Err(DecodeError::WrongInterval)
        );
        let v3 = Advert {
            version: Version::V3,
            auth: Auth::None,
            ..a.clone()
        };
        assert_eq!(
            p.judge(ip("10.0.0.12"), MC, &v3).verdict,
            Err(DecodeError::WrongVersion)
        );
        // A v3 instance migrating from v2 accepts both.
        let mut mig = Policy::new(Version::V3, 51, 100, pass, &[ip("10.0.0.100")], &[]);
        mig.accept_v2 = true;
        assert_eq!(mig.judge(ip("10.0.0.12"), MC, &a).verdict, Ok(()));
        assert_eq!(mig.judge(ip("10.0.0.12"), MC, &v3).verdict, Ok(()));
    }

    #[test]
    fn only_admitted_adverts_are_split_brain_evidence() {
        let me = ip("10.0.0.11");
        let u = unicast();
        let ok = u.judge(ip("10.0.0.12"), me, &advert(200, &["10.0.0.100"]));
        assert!(u.split_brain_evidence(&ok));
        let stranger = u.judge(ip("10.0.0.99"), me, &advert(255, &["10.0.0.100"]));
        assert!(stranger.claims_our_vips);
        assert!(!u.split_brain_evidence(&stranger));
        // A peer of ours that speaks the other version: a real second master.
        let mut v2 = advert(200, &["10.0.0.100"]);
        v2.version = Version::V2;
        v2.interval_cs = 100;
        let j = u.judge(ip("10.0.0.12"), me, &v2);
        assert_eq!(j.verdict, Err(DecodeError::WrongVersion));
        assert!(u.split_brain_evidence(&j));
        // The same from any source on a multicast instance (or with the source check off):
        // anyone can send it, so it is not evidence.
        let m = multicast();
        let mut v2m = advert(200, &["10.0.0.100", "10.0.0.101"]);
        v2m.version = Version::V2;
        let j = m.judge(ip("10.0.0.77"), MC, &v2m);
        assert!(!m.split_brain_evidence(&j));
        let open = Policy {
            check_unicast_src: false,
            ..unicast()
        };
        let j = open.judge(ip("10.0.0.77"), me, &v2);
        assert!(!open.split_brain_evidence(&j));
        // Priority 0 is a resignation, not a claim.
        let j = u.judge(ip("10.0.0.12"), me, &advert(0, &["10.0.0.100"]));
        assert!(!u.split_brain_evidence(&j));
    }

    #[test]
    fn ipv6_unicast_peers_meet_their_hop_bounds() {
        let mut p = Policy::new(
            Version::V3,
            51,
            10,
            Auth::None,
            &[ip("fd00::100")],
            &[ip("fd00::2"), ip("fd00::3")],
        );
        p.peer_hops = vec![(ip("fd00::2"), 250..=255)];
        let me = ip("fd00::1");
        assert!(p.hops_ok(ip("fd00::2"), me, 255));
        assert!(p.hops_ok(ip("fd00::2"), me, 250));
        assert!(!p.hops_ok(ip("fd00::2"), me, 249));
        assert!(!p.hops_ok(ip("fd00::2"), me, 64));
        // A peer without bounds: any hop limit (keepalived's default of 64 included).
        assert!(p.hops_ok(ip("fd00::3"), me, 64));
    }

    #[test]
    fn other_vrid_is_not_ours_to_judge() {
        let mut a = advert(255, &["10.0.0.100", "10.0.0.101"]);
        a.vrid = 52;
        let j = multicast().judge(ip("10.0.0.12"), MC, &a);
        assert_eq!(j.verdict, Err(DecodeError::OtherVrid));
        assert!(!j.claims_our_vips);
    }
}
