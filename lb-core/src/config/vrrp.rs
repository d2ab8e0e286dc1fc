//! One `[[vrrp]]` instance's configuration and its validation (pure).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigErrors, Validate};
use crate::vrrp::codec::{Auth, Version};

fn default_version() -> u8 {
    3
}
fn default_priority() -> u8 {
    100
}
fn default_true() -> bool {
    true
}
fn default_garp_refresh() -> u64 {
    60
}

/// The advert interval of fast failover (`lbctl render`'s `fast_failover`): master down after
/// 3 x 20 ms plus at most 20 ms of skew, so a backup answers within about 100 ms of the
/// master's death. Only where every VRRP speaker of the instance is lbd (VRRPv3): keepalived
/// peers would need the same `advert_int 0.02`, and OpenShift's keepalived uses VRRPv2 (whole
/// seconds).
pub const FAST_ADVERT_INTERVAL_MS: u32 = 20;

/// One `[[vrrp]]` entry of the daemon config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    pub name: String,
    /// Defaults to the daemon's interface.
    #[serde(default)]
    pub interface: Option<String>,
    pub vrid: u8,
    /// 2 or 3.
    #[serde(default = "default_version")]
    pub version: u8,
    /// 1..=255; 255 means this node owns the addresses.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// Default: 100 ms for v3, 1000 ms for v2 (v2 needs whole seconds).
    #[serde(default)]
    pub advert_interval_ms: Option<u32>,
    /// VRRPv2 simple-text password, at most 8 bytes.
    #[serde(default)]
    pub auth_pass: Option<String>,
    #[serde(default = "default_true")]
    pub preempt: bool,
    #[serde(default)]
    pub preempt_delay_ms: u64,
    /// Empty: multicast.
    #[serde(default)]
    pub unicast_peers: Vec<IpAddr>,
    /// Unicast: accept adverts only from `unicast_peers` (keepalived's `check_unicast_src`).
    /// On by default; turning it off lets any host that knows our VRID and VIPs vote.
    #[serde(default = "default_true")]
    pub check_unicast_src: bool,
    /// Migration from VRRPv2 (version = 3 only, IPv4, whole-second interval): also send VRRPv2
    /// adverts (with `auth_pass`) and count VRRPv2 adverts as votes, so v2 and v3 speakers of
    /// one instance hear each other while nodes switch one by one. See docs/operations.md.
    #[serde(default)]
    pub v2_compat: bool,
    /// IPv6 unicast only: the hop limits a peer's adverts may arrive with, as keepalived's
    /// `unicast_peer { ADDR min_ttl N max_ttl M }` (keepalived sends IPv6 unicast adverts with
    /// hop limit 64 unless `unicast_ttl` is set). A peer not listed is accepted with any hop
    /// limit. IPv4 adverts always need TTL 255 and IPv6 multicast hop limit 255.
    #[serde(default)]
    pub unicast_peer_ttl: Vec<PeerTtl>,
    /// Source address of adverts; default: the interface's first address (IPv6: link-local).
    #[serde(default)]
    pub unicast_src: Option<IpAddr>,
    pub vips: Vec<IpAddr>,
    /// Re-announce the VIPs this often while master; 0 disables the refresh.
    #[serde(default = "default_garp_refresh")]
    pub garp_refresh_s: u64,
    /// A second burst of announcements this long after becoming master (keepalived's
    /// `garp_master_delay`, 5 s by default), for switches and hosts that missed the first while
    /// the link or the spanning tree settled; 0: one burst only.
    #[serde(default = "default_garp_master_delay")]
    pub garp_master_delay_s: u64,
    /// Instances with the same group move together (keepalived's `vrrp_sync_group`): FAULT
    /// spreads to every member, they share the lowest tracked weight, and the first member in
    /// config order leads the others (see lb-userspace's `vrrp::group`). Members need the same priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

fn default_garp_master_delay() -> u64 {
    5
}

/// Hop-limit bounds for one IPv6 unicast peer (see `InstanceConfig::unicast_peer_ttl`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerTtl {
    /// One of `unicast_peers`.
    pub address: IpAddr,
    #[serde(default)]
    pub min_ttl: u8,
    #[serde(default = "default_max_ttl")]
    pub max_ttl: u8,
}

fn default_max_ttl() -> u8 {
    255
}

/// Fields relative to this entry (`auth_pass`); the daemon's config names them
/// `vrrp[i].auth_pass`.
impl Validate for InstanceConfig {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        if self.name.is_empty() {
            errors.add("name", "must not be empty");
        }
        if self.group.as_deref().is_some_and(str::is_empty) {
            errors.add(
                "group",
                "must not be empty (omit it for an instance of its own)",
            );
        }
        if let Some(i) = &self.interface
            && (i.is_empty() || i.len() >= crate::net::IFNAMSIZ)
        {
            errors.add("interface", format!("{i:?} is not a valid interface name"));
        }
        if self.vrid == 0 {
            errors.add("vrid", "must be 1..=255");
        }
        let version = match self.version {
            2 => Version::V2,
            3 => Version::V3,
            v => {
                // The other checks depend on the version.
                errors.add("version", format!("{v} is not 2 or 3"));
                return;
            }
        };
        if self.priority == 0 {
            errors.add("priority", "must be 1..=255 (0 is reserved for resigning)");
        }
        let ms = self.interval_ms();
        match version {
            Version::V2 if !ms.is_multiple_of(1000) || !(1000..=255_000).contains(&ms) => {
                errors.add(
                    "advert_interval_ms",
                    format!("{ms}: VRRPv2 needs whole seconds, 1000..=255000"),
                );
            }
            Version::V3 if !ms.is_multiple_of(10) || !(10..=40_950).contains(&ms) => {
                errors.add(
                    "advert_interval_ms",
                    format!("{ms}: VRRPv3 needs centiseconds, 10..=40950 in steps of 10"),
                );
            }
            _ => {}
        }
        if self.v2_compat {
            if version != Version::V3 {
                errors.add(
                    "v2_compat",
                    "only for version = 3 (a v2 instance speaks v2)",
                );
            }
            if !ms.is_multiple_of(1000) || ms > 255_000 {
                errors.add(
                    "v2_compat",
                    format!("advert_interval_ms {ms}: VRRPv2 peers need whole seconds"),
                );
            }
        }
        if let Some(pass) = &self.auth_pass {
            if version == Version::V3 && !self.v2_compat {
                errors.add("auth_pass", "VRRPv3 has no authentication");
            }
            if pass.is_empty() {
                errors.add(
                    "auth_pass",
                    "must not be empty (omit it for no authentication)",
                );
            }
            if pass.len() > 8 {
                errors.add("auth_pass", "longer than 8 bytes");
            }
        }
        let Some(first) = self.vips.first() else {
            errors.add("vips", "at least one VIP is needed");
            return;
        };
        let v6 = first.is_ipv6();
        for (i, vip) in self.vips.iter().enumerate() {
            if vip.is_ipv6() != v6 {
                errors.add(
                    format!("vips[{i}]"),
                    format!("{vip}: all VIPs must be one address family"),
                );
            }
            if vip.is_unspecified() || vip.is_multicast() || vip.is_loopback() {
                errors.add(format!("vips[{i}]"), format!("{vip} cannot be a VIP"));
            }
            if self.vips[..i].contains(vip) {
                errors.add(format!("vips[{i}]"), format!("{vip} is listed twice"));
            }
        }
        if version == Version::V2 && v6 {
            errors.add(
                "version",
                "VRRPv2 is IPv4 only; use version 3 for IPv6 VIPs",
            );
        }
        if self.v2_compat && v6 {
            errors.add("v2_compat", "VRRPv2 is IPv4 only");
        }
        for (i, peer) in self.unicast_peers.iter().enumerate() {
            if peer.is_ipv6() != v6 {
                errors.add(
                    format!("unicast_peers[{i}]"),
                    format!("{peer}: not the VIPs' address family"),
                );
            }
        }
        for (i, b) in self.unicast_peer_ttl.iter().enumerate() {
            let f = format!("unicast_peer_ttl[{i}]");
            if !self.unicast_peers.contains(&b.address) {
                errors.add(
                    format!("{f}.address"),
                    format!("{} is not one of unicast_peers", b.address),
                );
            }
            if b.address.is_ipv4() {
                errors.add(
                    format!("{f}.address"),
                    "IPv4 adverts always need TTL 255; bounds are for IPv6 unicast peers",
                );
            }
            if b.min_ttl > b.max_ttl {
                errors.add(
                    format!("{f}.min_ttl"),
                    format!("{} is above max_ttl {}", b.min_ttl, b.max_ttl),
                );
            }
            if self.unicast_peer_ttl[..i]
                .iter()
                .any(|o| o.address == b.address)
            {
                errors.add(format!("{f}.address"), "listed twice");
            }
        }
        if let Some(src) = self.unicast_src
            && src.is_ipv6() != v6
        {
            errors.add(
                "unicast_src",
                format!("{src}: not the VIPs' address family"),
            );
        }
        if self.garp_master_delay_s > 3600 {
            errors.add("garp_master_delay_s", "more than an hour");
        }
        if self.preempt_delay_ms > 3_600_000 {
            errors.add("preempt_delay_ms", "more than an hour");
        }
    }
}

impl InstanceConfig {
    /// The advert interval, as configured or by version.
    pub fn interval_ms(&self) -> u32 {
        self.advert_interval_ms
            .unwrap_or(if self.version == 2 { 1000 } else { 100 })
    }

    pub fn codec_version(&self) -> Version {
        if self.version == 2 {
            Version::V2
        } else {
            Version::V3
        }
    }

    /// The VRRPv2 authentication (of our v2 adverts, also in `v2_compat`).
    pub fn auth(&self) -> Auth {
        match &self.auth_pass {
            Some(p) if self.version == 2 || self.v2_compat => Auth::simple(p),
            _ => Auth::None,
        }
    }

    /// The fields whose change needs the instance restarted (it resigns and starts again);
    /// everything else is applied in place. `None`: the two configs can be applied in place.
    /// Sends VRRPv2 adverts: version 2, or 3 with `v2_compat`.
    pub fn speaks_v2(&self) -> bool {
        self.version == 2 || self.v2_compat
    }

    /// Why a reload from `self` to `new` must not switch this instance's VRRP version: from
    /// plain VRRPv2 straight to VRRPv3 without `v2_compat` (or back), the instance and the
    /// peers still on the old version stop hearing each other and each side elects its own
    /// master. The safe way goes through version 3 with `v2_compat = true` on every node
    /// (both versions on the wire, applied in place), then drops `v2_compat`.
    pub fn version_switch_refused(&self, new: &InstanceConfig) -> Option<String> {
        (self.version != new.version && !(self.speaks_v2() && new.speaks_v2())).then(|| {
            format!(
                "version {} -> {} directly would leave this node and its peers still on version {} unable to hear each other (two masters); switch through version = 3 with v2_compat = true on every node first",
                self.version, new.version, self.version
            )
        })
    }

    pub fn restart_needed(&self, new: &InstanceConfig) -> Option<&'static str> {
        let mut ours = self.vips.clone();
        ours.sort();
        let mut theirs = new.vips.clone();
        theirs.sort();
        [
            ("name", self.name != new.name),
            ("interface", self.interface != new.interface),
            ("vrid", self.vrid != new.vrid),
            // Between 2 and 3 with `v2_compat` the VRRPv2 adverts go on: the instance switches
            // in place, its peers hear no change (see `version_switch_refused`).
            (
                "version",
                self.version != new.version && !(self.speaks_v2() && new.speaks_v2()),
            ),
            ("vips", ours != theirs),
            ("unicast_src", self.unicast_src != new.unicast_src),
            // Multicast <-> unicast changes the socket's group membership.
            (
                "unicast_peers",
                self.unicast_peers.is_empty() != new.unicast_peers.is_empty(),
            ),
        ]
        .into_iter()
        .find(|(_, changed)| *changed)
        .map(|(f, _)| f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> InstanceConfig {
        toml::from_str(
            r#"
            name = "api"
            vrid = 14
            vips = ["192.0.2.100"]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn defaults() {
        let c = cfg();
        assert_eq!(c.version, 3);
        assert_eq!(c.priority, 100);
        assert_eq!(c.interval_ms(), 100);
        assert!(c.preempt);
        assert_eq!(c.garp_refresh_s, 60);
        assert_eq!(c.garp_master_delay_s, 5);
        assert!(c.unicast_peers.is_empty());
        assert!(c.check_unicast_src);
        assert!(!c.v2_compat);
        c.validate().unwrap();
        let v2 = InstanceConfig {
            version: 2,
            ..cfg()
        };
        assert_eq!(v2.interval_ms(), 1000);
        v2.validate().unwrap();
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<InstanceConfig, _> = toml::from_str("name='a'\nvrid=1\nvips=[]\nprio=3\n");
        assert!(r.unwrap_err().to_string().contains("prio"));
    }

    #[test]
    fn validation_names_the_field() {
        let e = |f: fn(&mut InstanceConfig)| {
            let mut c = cfg();
            f(&mut c);
            c.validate_at("vrrp[0]").unwrap_err().to_string()
        };
        assert_eq!(
            e(|c| {
                c.version = 2;
                c.auth_pass = Some("ocp_api_vip".into());
            }),
            "vrrp[0].auth_pass: longer than 8 bytes"
        );
        assert!(e(|c| c.auth_pass = Some("x".into())).starts_with("vrrp[0].auth_pass: VRRPv3"));
        assert!(e(|c| c.vrid = 0).starts_with("vrrp[0].vrid:"));
        assert!(e(|c| c.version = 4).starts_with("vrrp[0].version:"));
        assert!(e(|c| c.priority = 0).starts_with("vrrp[0].priority:"));
        assert!(e(|c| c.advert_interval_ms = Some(15)).starts_with("vrrp[0].advert_interval_ms:"));
        assert!(
            e(|c| {
                c.version = 2;
                c.advert_interval_ms = Some(1500);
            })
            .starts_with("vrrp[0].advert_interval_ms: 1500: VRRPv2")
        );
        assert!(e(|c| c.vips.clear()).starts_with("vrrp[0].vips:"));
        assert!(e(|c| c.vips.push("2001:db8::1".parse().unwrap())).starts_with("vrrp[0].vips[1]:"));
        assert!(e(|c| c.vips.push("192.0.2.100".parse().unwrap())).contains("listed twice"));
        assert!(
            e(|c| c.unicast_peers = vec!["fe80::1".parse().unwrap()])
                .starts_with("vrrp[0].unicast_peers[0]:")
        );
        assert!(
            e(|c| c.unicast_src = Some("fe80::1".parse().unwrap()))
                .starts_with("vrrp[0].unicast_src:")
        );
        assert!(
            e(|c| {
                c.version = 2;
                c.vips = vec!["2001:db8::1".parse().unwrap()];
            })
            .starts_with("vrrp[0].version:")
        );
        assert!(
            e(|c| c.interface = Some("a-very-long-interface".into()))
                .starts_with("vrrp[0].interface:")
        );
    }

    #[test]
    fn peer_ttl_bounds_are_for_listed_ipv6_peers() {
        let mut c = cfg();
        c.vips = vec!["fd00::100".parse().unwrap()];
        c.unicast_peers = vec!["fd00::2".parse().unwrap()];
        c.unicast_peer_ttl = vec![PeerTtl {
            address: "fd00::2".parse().unwrap(),
            min_ttl: 250,
            max_ttl: 255,
        }];
        c.validate().unwrap();
        let mut bad = c.clone();
        bad.unicast_peer_ttl[0].address = "fd00::3".parse().unwrap();
        assert!(
            bad.validate_at("vrrp[0]")
                .unwrap_err()
                .to_string()
                .starts_with("vrrp[0].unicast_peer_ttl[0].address:")
        );
        let mut bad = c.clone();
        bad.unicast_peer_ttl[0].min_ttl = 255;
        bad.unicast_peer_ttl[0].max_ttl = 64;
        assert!(
            bad.validate_at("vrrp[0]")
                .unwrap_err()
                .to_string()
                .starts_with("vrrp[0].unicast_peer_ttl[0].min_ttl:")
        );
        let mut v4 = cfg();
        v4.unicast_peers = vec!["192.0.2.9".parse().unwrap()];
        v4.unicast_peer_ttl = vec![PeerTtl {
            address: "192.0.2.9".parse().unwrap(),
            min_ttl: 0,
            max_ttl: 255,
        }];
        assert!(v4.validate().unwrap_err().to_string().contains("TTL 255"));
        let parsed: InstanceConfig = toml::from_str(
            r#"
            name = "api6"
            vrid = 14
            vips = ["fd00::100"]
            unicast_peers = ["fd00::2"]
            unicast_peer_ttl = [{ address = "fd00::2", min_ttl = 64 }]
            "#,
        )
        .unwrap();
        assert_eq!(parsed.unicast_peer_ttl[0].max_ttl, 255);
    }

    #[test]
    fn v2_compat_needs_v3_ipv4_and_whole_seconds() {
        let e = |f: fn(&mut InstanceConfig)| {
            let mut c = cfg();
            c.v2_compat = true;
            c.advert_interval_ms = Some(1000);
            c.auth_pass = Some("ostest_a".into());
            f(&mut c);
            c.validate_at("vrrp[0]").map_err(|e| e.to_string())
        };
        assert_eq!(e(|_| {}), Ok(()));
        assert!(
            e(|c| c.version = 2)
                .unwrap_err()
                .starts_with("vrrp[0].v2_compat:")
        );
        assert!(
            e(|c| c.advert_interval_ms = Some(100))
                .unwrap_err()
                .starts_with("vrrp[0].v2_compat:")
        );
        assert!(
            e(|c| c.vips = vec!["2001:db8::1".parse().unwrap()])
                .unwrap_err()
                .contains("v2_compat")
        );
        let mut c = cfg();
        c.v2_compat = true;
        c.advert_interval_ms = Some(1000);
        c.auth_pass = Some("ostest_a".into());
        assert_eq!(c.auth(), Auth::simple("ostest_a"));
    }

    #[test]
    fn a_version_switch_keeps_vrrpv2_on_the_wire_or_is_refused() {
        let v2 = InstanceConfig {
            version: 2,
            advert_interval_ms: Some(1000),
            auth_pass: Some("ostest_a".into()),
            ..cfg()
        };
        let compat = InstanceConfig {
            version: 3,
            v2_compat: true,
            ..v2.clone()
        };
        let v3 = InstanceConfig {
            v2_compat: false,
            auth_pass: None,
            advert_interval_ms: Some(100),
            ..compat.clone()
        };
        // v2 -> v3 + v2_compat -> v3, and back: every step in place, none refused.
        for (a, b) in [
            (&v2, &compat),
            (&compat, &v3),
            (&v3, &compat),
            (&compat, &v2),
        ] {
            assert_eq!(a.restart_needed(b), None, "{a:?} -> {b:?}");
            assert_eq!(a.version_switch_refused(b), None);
        }
        // Straight from plain v2 to plain v3 (or back): refused, saying the way through.
        for (a, b) in [(&v2, &v3), (&v3, &v2)] {
            let why = a.version_switch_refused(b).expect("refused");
            assert!(why.contains("v2_compat = true"), "{why}");
            assert_eq!(a.restart_needed(b), Some("version"));
        }
    }

    #[test]
    fn what_a_reload_may_change_in_place() {
        let old = cfg();
        let same = |f: fn(&mut InstanceConfig)| {
            let mut c = cfg();
            f(&mut c);
            old.restart_needed(&c)
        };
        assert_eq!(same(|c| c.priority = 7), None);
        assert_eq!(same(|c| c.advert_interval_ms = Some(200)), None);
        assert_eq!(same(|c| c.preempt = false), None);
        assert_eq!(same(|c| c.preempt_delay_ms = 5000), None);
        assert_eq!(same(|c| c.garp_refresh_s = 5), None);
        assert_eq!(same(|c| c.vrid = 9), Some("vrid"));
        assert_eq!(same(|c| c.version = 2), Some("version"));
        assert_eq!(
            same(|c| c.vips = vec!["192.0.2.101".parse().unwrap()]),
            Some("vips")
        );
        assert_eq!(
            same(|c| c.unicast_peers = vec!["192.0.2.9".parse().unwrap()]),
            Some("unicast_peers")
        );
        let mut uni = cfg();
        uni.unicast_peers = vec!["192.0.2.9".parse().unwrap()];
        let mut uni2 = uni.clone();
        uni2.unicast_peers.push("192.0.2.8".parse().unwrap());
        assert_eq!(uni.restart_needed(&uni2), None, "peers change in place");
    }

    #[test]
    fn openshift_style_v2_config() {
        let c: InstanceConfig = toml::from_str(
            r#"
            name = "ostest_API"
            vrid = 14
            version = 2
            priority = 40
            advert_interval_ms = 1000
            auth_pass = "ostest_a"
            unicast_peers = ["192.0.2.11", "192.0.2.12"]
            unicast_src = "192.0.2.10"
            vips = ["192.0.2.5"]
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.auth(), Auth::simple("ostest_a"));
        assert_eq!(c.codec_version(), Version::V2);
    }
}
