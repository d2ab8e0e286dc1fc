//! The `[[bgp]]` section: this node's BGP identity, its peers, BFD timers and the communities
//! its VIP announcements carry. Pure: validation only, every error names the field.

use std::{collections::HashSet, net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigErrors, Validate};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BgpConfig {
    /// This node's autonomous system number.
    pub asn: u32,
    /// BGP router id (an IPv4 address); FRR picks one when absent.
    #[serde(default)]
    pub router_id: Option<std::net::Ipv4Addr>,
    /// The upstream routers.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    #[serde(default)]
    pub bfd: BfdConfig,
    /// Standard communities (`ASN:VALUE`, or `no-export`, `no-advertise`, `local-AS`) on every
    /// VIP announcement.
    #[serde(default)]
    pub communities: Vec<String>,
    /// Directory of FRR's vty sockets (vtysh `--vty_socket`); FRR's default when absent.
    #[serde(default)]
    pub vty_socket: Option<PathBuf>,
    /// The vtysh binary.
    #[serde(default = "default_vtysh")]
    pub vtysh: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub address: IpAddr,
    /// The peer's autonomous system number (eBGP when it differs from ours).
    pub asn: u32,
    /// Tie the session to BFD (sub-second failure detection).
    #[serde(default = "default_true")]
    pub bfd: bool,
    /// Optional description shown by `lbctl bgp status`.
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BfdConfig {
    /// Desired minimum transmit interval (ms).
    #[serde(default = "default_bfd_ms")]
    pub transmit_ms: u32,
    /// Required minimum receive interval (ms).
    #[serde(default = "default_bfd_ms")]
    pub receive_ms: u32,
    /// Missed packets before the session is declared down: detection time is
    /// `multiplier x max(receive_ms, peer's transmit)`.
    #[serde(default = "default_multiplier")]
    pub multiplier: u32,
}

impl Default for BfdConfig {
    fn default() -> Self {
        BfdConfig {
            transmit_ms: default_bfd_ms(),
            receive_ms: default_bfd_ms(),
            multiplier: default_multiplier(),
        }
    }
}

impl BfdConfig {
    /// Local detection time in milliseconds.
    pub fn detect_ms(&self) -> u32 {
        self.receive_ms * self.multiplier
    }
}

fn default_vtysh() -> PathBuf {
    "vtysh".into()
}
fn default_true() -> bool {
    true
}
fn default_bfd_ms() -> u32 {
    100
}
fn default_multiplier() -> u32 {
    3
}

/// AS_TRANS (RFC 6793) stands in for 4-byte ASNs on old speakers; never a real ASN.
const AS_TRANS: u32 = 23456;

fn check_asn(field: &str, asn: u32, errors: &mut ConfigErrors) {
    if asn == 0 || asn == AS_TRANS || asn == u32::MAX {
        errors.add(
            field,
            format!("{asn} is not a usable AS number (0, 23456 and 4294967295 are reserved)"),
        );
    }
}

/// A standard community as FRR writes it; `None` if `s` is not one.
pub fn parse_community(s: &str) -> Option<String> {
    match s {
        "no-export" | "no-advertise" | "local-AS" | "no-peer" | "graceful-shutdown" => {
            return Some(s.to_string());
        }
        _ => {}
    }
    let (a, b) = s.split_once(':')?;
    let a: u16 = a.parse().ok()?;
    let b: u16 = b.parse().ok()?;
    Some(format!("{a}:{b}"))
}

/// Fields relative to this `[[bgp]]` section.
impl Validate for BgpConfig {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        check_asn("asn", self.asn, errors);
        if self.peers.is_empty() {
            errors.add("peers", "at least one peer is needed to announce anything");
        }
        let mut seen = HashSet::new();
        for (i, p) in self.peers.iter().enumerate() {
            let pf = format!("peers[{i}]");
            if p.address.is_unspecified() || p.address.is_multicast() || p.address.is_loopback() {
                errors.add(format!("{pf}.address"), "must be a unicast address");
            }
            if !seen.insert(p.address) {
                errors.add(format!("{pf}.address"), "listed twice");
            }
            check_asn(&format!("{pf}.asn"), p.asn, errors);
            if let Some(d) = &p.description
                && (d.len() > 80 || d.chars().any(|c| c.is_control()))
            {
                errors.add(
                    format!("{pf}.description"),
                    "at most 80 printable characters",
                );
            }
        }
        let b = &self.bfd;
        for (name, v) in [("transmit_ms", b.transmit_ms), ("receive_ms", b.receive_ms)] {
            if !(10..=60_000).contains(&v) {
                errors.add(
                    format!("bfd.{name}"),
                    format!("must be 10..=60000 ms, got {v}"),
                );
            }
        }
        if !(2..=255).contains(&b.multiplier) {
            errors.add(
                "bfd.multiplier",
                format!("must be 2..=255, got {}", b.multiplier),
            );
        }
        for (i, c) in self.communities.iter().enumerate() {
            if parse_community(c).is_none() {
                errors.add(
                    format!("communities[{i}]"),
                    format!(
                        "{c:?} is not a community (want ASN:VALUE with 16-bit parts, or no-export, no-advertise, local-AS, no-peer, graceful-shutdown)"
                    ),
                );
            }
        }
        if self.vtysh.as_os_str().is_empty() {
            errors.add("vtysh", "must not be empty");
        }
    }
}

/// A VIP with `announce = "bgp"`, as the config names it (`Config::bgp_vips`): lb-userspace's `bgp`
/// takes what it needs of the config as arguments, never a `Config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BgpVip {
    pub name: String,
    pub address: IpAddr,
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const GOOD: &str = r#"
interface = "eth0"
[[bgp]]
asn = 65001
communities = ["65001:100"]
[bgp.bfd]
receive_ms = 100
[[bgp.peers]]
address = "10.0.0.1"
asn = 65000
[[vips]]
name = "ingress"
address = "10.9.0.7"
ports = [80, 443]
announce = "bgp"
[[vips.backends]]
address = "10.0.0.21"
"#;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_bgp_with_defaults() {
        let c = Config::parse(GOOD).unwrap();
        let b = &c.bgp[0];
        assert_eq!(b.asn, 65001);
        assert_eq!((b.bfd.transmit_ms, b.bfd.multiplier), (100, 3));
        assert_eq!(b.bfd.detect_ms(), 300);
        assert!(b.peers[0].bfd);
        assert_eq!(c.vips[0].announce, crate::config::Announce::Bgp);
        // Every node forwards a BGP VIP.
        assert!(crate::plan::owned(&c, 0, &Default::default()));
    }

    #[test]
    fn shipped_bgp_example_is_valid() {
        let c = Config::parse(include_str!("../../../deploy/examples/bgp-ingress.toml")).unwrap();
        assert_eq!(c.bgp[0].peers.len(), 2);
        assert_eq!(c.vips[0].announce, crate::config::Announce::Bgp);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("asn = 65001", "asn = 0", "bgp[0].asn:"),
            ("asn = 65000", "asn = 23456", "bgp[0].peers[0].asn:"),
            ("\"10.0.0.1\"", "\"0.0.0.0\"", "bgp[0].peers[0].address:"),
            (
                "\"65001:100\"",
                "\"65001:100000\"",
                "bgp[0].communities[0]:",
            ),
            ("\"65001:100\"", "\"bogus\"", "bgp[0].communities[0]:"),
            (
                "receive_ms = 100",
                "receive_ms = 5",
                "bgp[0].bfd.receive_ms:",
            ),
            (
                "receive_ms = 100",
                "multiplier = 1",
                "bgp[0].bfd.multiplier:",
            ),
            (
                "announce = \"bgp\"",
                "announce = \"bgp\"\nvrrp = \"x\"",
                "vips[0].",
            ),
        ];
        for (from, to, want) in cases {
            let e = err(&GOOD.replace(from, to));
            assert!(e.starts_with(want), "{to}: {e}");
        }
        let e = err(&GOOD.replace("[[bgp.peers]]\naddress = \"10.0.0.1\"\nasn = 65000\n", ""));
        assert!(e.starts_with("bgp[0].peers:"), "{e}");
        let twice = GOOD.replace(
            "[[vips]]",
            "[[bgp.peers]]\naddress = \"10.0.0.1\"\nasn = 65000\n[[vips]]",
        );
        assert!(err(&twice).starts_with("bgp[0].peers[1].address:"));
        let no_section = GOOD.split("[[vips]]").nth(1).unwrap();
        let e = err(&format!("interface = \"eth0\"\n[[vips]]{no_section}"));
        assert!(e.starts_with("vips[0].announce:"), "{e}");
        let e = err(&GOOD.replace("announce = \"bgp\"", "announce = \"ospf\""));
        assert!(e.contains("announce"), "{e}");
        let e = err(&format!(
            "{GOOD}\n[[bgp]]\nasn = 65002\n[[bgp.peers]]\naddress = \"10.0.0.2\"\nasn = 65000\n"
        ));
        assert!(e.starts_with("bgp[1]:"), "{e}");
    }
}
