//! FRR as lbd's routing daemon. lbd never speaks BGP: it configures FRR's BGP and BFD through
//! vtysh (FRR's supported configuration interface) and announces a VIP by installing a kernel
//! route that FRR redistributes (see [`super::routes`]).
//!
//! What lbd writes into FRR is a pure function of the `[[bgp]]` section and the BGP VIP
//! addresses ([`render`]); every object it owns is named `lb-*` so an operator's own FRR config
//! lives alongside untouched:
//! - prefix-lists `lb-vips-v4` / `lb-vips-v6`: exactly the configured BGP VIP host routes, so a
//!   kernel route another program installs is never announced;
//! - route-map `lb-announce` (redistribution and the peers' outbound policy): those prefixes,
//!   with the configured communities; route-map `lb-import`: accept nothing from the peers (the
//!   LB node needs no routes from them, and explicit policies satisfy RFC 8212);
//! - BFD profile `lb` with the configured timers, tied to each peer.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::config::{BgpConfig, parse_community};

pub const PREFIX_LIST_V4: &str = "lb-vips-v4";
pub const PREFIX_LIST_V6: &str = "lb-vips-v6";
pub const ROUTE_MAP_OUT: &str = "lb-announce";
pub const ROUTE_MAP_IN: &str = "lb-import";
pub const BFD_PROFILE: &str = "lb";

/// The vtysh configuration commands (each run in order after `configure terminal`) that bring
/// FRR to `cfg` for the VIP addresses `vips`. `old` is the section applied before (on reload):
/// peers it had that `cfg` lacks are removed, and a changed local AS replaces the instance.
pub fn render(old: Option<&BgpConfig>, cfg: &BgpConfig, vips: &[std::net::IpAddr]) -> Vec<String> {
    let mut c = Vec::new();
    if let Some(old) = old
        && old.asn != cfg.asn
    {
        c.push(format!("no router bgp {}", old.asn));
    }
    // Prefix-list entries are added in place; [`stale_entries`] removes the ones no longer
    // wanted. Nothing lbd owns is ever deleted and re-created while in use: FRR 8.4's bgpd can
    // crash redistributing through a route-map that was deleted under it. The final deny keeps
    // each list defined even with no VIP of that family.
    c.extend(prefix_list_entries(vips));
    let communities: Vec<String> = cfg
        .communities
        .iter()
        .filter_map(|s| parse_community(s))
        .collect();
    for (seq, matcher) in [
        (10, format!("match ip address prefix-list {PREFIX_LIST_V4}")),
        (
            20,
            format!("match ipv6 address prefix-list {PREFIX_LIST_V6}"),
        ),
    ] {
        c.push(format!("route-map {ROUTE_MAP_OUT} permit {seq}"));
        c.push(matcher);
        if communities.is_empty() {
            c.push("no set community".into());
        } else {
            c.push(format!("set community {}", communities.join(" ")));
        }
        c.push("exit".into());
    }
    c.push(format!("route-map {ROUTE_MAP_IN} deny 10"));
    c.push("exit".into());

    c.push("bfd".into());
    c.push(format!("profile {BFD_PROFILE}"));
    c.push(format!("transmit-interval {}", cfg.bfd.transmit_ms));
    c.push(format!("receive-interval {}", cfg.bfd.receive_ms));
    c.push(format!("detect-multiplier {}", cfg.bfd.multiplier));
    c.push("exit".into());
    c.push("exit".into());

    c.push(format!("router bgp {}", cfg.asn));
    if let Some(id) = cfg.router_id {
        c.push(format!("bgp router-id {id}"));
    }
    if let Some(old) = old.filter(|o| o.asn == cfg.asn) {
        for p in &old.peers {
            if !cfg.peers.iter().any(|n| n.address == p.address) {
                c.push(format!("no neighbor {}", p.address));
            }
        }
    }
    for p in &cfg.peers {
        let a = p.address;
        c.push(format!("neighbor {a} remote-as {}", p.asn));
        match &p.description {
            Some(d) => c.push(format!("neighbor {a} description {d}")),
            None => c.push(format!("no neighbor {a} description")),
        }
        if p.bfd {
            c.push(format!("neighbor {a} bfd profile {BFD_PROFILE}"));
        } else {
            c.push(format!("no neighbor {a} bfd"));
        }
        // Announce and withdraw at once rather than batching (eBGP MRAI).
        c.push(format!("neighbor {a} advertisement-interval 0"));
        c.push(format!("neighbor {a} timers connect 5"));
    }
    for af in ["ipv4", "ipv6"] {
        c.push(format!("address-family {af} unicast"));
        c.push(format!("redistribute kernel route-map {ROUTE_MAP_OUT}"));
        for p in &cfg.peers {
            let a = p.address;
            c.push(format!("neighbor {a} activate"));
            c.push(format!("neighbor {a} route-map {ROUTE_MAP_IN} in"));
            c.push(format!("neighbor {a} route-map {ROUTE_MAP_OUT} out"));
        }
        c.push("exit-address-family".into());
    }
    c.push("exit".into());
    c
}

/// The prefix-list lines (as FRR's running config prints them) for the VIP addresses.
pub fn prefix_list_entries(vips: &[std::net::IpAddr]) -> Vec<String> {
    let mut c = Vec::new();
    for (list, v4, cmd) in [
        (PREFIX_LIST_V4, true, "ip"),
        (PREFIX_LIST_V6, false, "ipv6"),
    ] {
        let mut seq = 5;
        for a in vips.iter().filter(|a| a.is_ipv4() == v4) {
            let len = if v4 { 32 } else { 128 };
            c.push(format!(
                "{cmd} prefix-list {list} seq {seq} permit {a}/{len}"
            ));
            seq += 5;
        }
        c.push(format!("{cmd} prefix-list {list} seq 100000 deny any"));
    }
    c
}

/// `no ...` for every entry of lbd's prefix-lists in FRR's running config that `wanted` lacks
/// (a VIP removed on reload, or left by an earlier lbd with another config).
pub fn stale_entries(running_config: &str, wanted: &[String]) -> Vec<String> {
    running_config
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.starts_with(&format!("ip prefix-list {PREFIX_LIST_V4} "))
                || l.starts_with(&format!("ipv6 prefix-list {PREFIX_LIST_V6} "))
        })
        .filter(|l| !wanted.iter().any(|w| w == l))
        .map(|l| format!("no {l}"))
        .collect()
}

/// The lines of lbd's own objects that FRR's running config must show while lbd's section
/// `cfg` is applied: its BGP instance, each peer with lbd's outbound policy, the kernel
/// redistribution through `lb-announce`, both route-maps, both prefix-lists and the BFD
/// profile. An instance of the same AS that an operator's config (or an FRR restart from its
/// saved config) brings without them announces nothing of lbd's.
pub fn required_lines(cfg: &BgpConfig) -> Vec<String> {
    let mut want = vec![
        format!("router bgp {}", cfg.asn),
        format!("redistribute kernel route-map {ROUTE_MAP_OUT}"),
        format!("route-map {ROUTE_MAP_OUT} permit 10"),
        format!("route-map {ROUTE_MAP_OUT} permit 20"),
        format!("route-map {ROUTE_MAP_IN} deny 10"),
        format!("ip prefix-list {PREFIX_LIST_V4} seq 100000 deny any"),
        format!("ipv6 prefix-list {PREFIX_LIST_V6} seq 100000 deny any"),
        format!("profile {BFD_PROFILE}"),
    ];
    for p in &cfg.peers {
        want.push(format!("neighbor {} remote-as {}", p.address, p.asn));
        want.push(format!(
            "neighbor {} route-map {ROUTE_MAP_OUT} out",
            p.address
        ));
    }
    want
}

/// Which of [`required_lines`] `running_config` lacks (empty: all of lbd's objects are there).
pub fn missing_objects(running_config: &str, cfg: &BgpConfig) -> Vec<String> {
    let have: std::collections::HashSet<&str> = running_config.lines().map(str::trim).collect();
    required_lines(cfg)
        .into_iter()
        .filter(|l| !have.contains(l.as_str()))
        .collect()
}

/// The commands that remove everything lbd configured (its `[[bgp]]` section was removed).
pub fn render_removal(old: &BgpConfig) -> Vec<String> {
    vec![
        format!("no router bgp {}", old.asn),
        format!("no route-map {ROUTE_MAP_OUT}"),
        format!("no route-map {ROUTE_MAP_IN}"),
        format!("no ip prefix-list {PREFIX_LIST_V4}"),
        format!("no ipv6 prefix-list {PREFIX_LIST_V6}"),
    ]
}

/// How lbd reaches FRR: vtysh, optionally pointed at a non-default vty socket directory.
#[derive(Clone, Debug)]
pub struct Vtysh {
    pub program: PathBuf,
    pub vty_socket: Option<PathBuf>,
}

const VTYSH_TIMEOUT: Duration = Duration::from_secs(10);

impl Vtysh {
    pub fn new(cfg: &BgpConfig) -> Self {
        Vtysh {
            program: cfg.vtysh.clone(),
            vty_socket: cfg.vty_socket.clone(),
        }
    }

    async fn run(&self, commands: &[String]) -> Result<String> {
        let mut cmd = tokio::process::Command::new(&self.program);
        if let Some(d) = &self.vty_socket {
            cmd.arg("--vty_socket").arg(d);
        }
        for c in commands {
            cmd.arg("-c").arg(c);
        }
        cmd.kill_on_drop(true);
        let out = tokio::time::timeout(VTYSH_TIMEOUT, cmd.output())
            .await
            .context("vtysh did not answer within 10 s")?
            .with_context(|| format!("run {}", self.program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            bail!(
                "vtysh failed ({}): {}{}",
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(stdout)
    }

    /// Apply configuration commands in order. vtysh stops at the first command FRR refuses
    /// and fails with its message; removing an object that does not exist is not an error.
    pub async fn configure(&self, commands: &[String]) -> Result<()> {
        let mut all = vec!["configure terminal".to_string()];
        all.extend(commands.iter().cloned());
        self.run(&all).await.context("configure FRR")?;
        Ok(())
    }

    pub async fn running_config(&self) -> Result<String> {
        self.run(&["show running-config".to_string()]).await
    }

    pub async fn show_json(&self, what: &str) -> Result<serde_json::Value> {
        let out = self.run(&[what.to_string()]).await?;
        serde_json::from_str(&out).with_context(|| format!("parse `{what}`: {out}"))
    }
}

/// One BGP session as `lbctl bgp status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Session {
    pub peer: String,
    pub asn: u32,
    pub description: Option<String>,
    /// BGP FSM state (Established, Active, Connect, ...), or "unknown" when FRR did not say.
    pub state: String,
    pub uptime: String,
    /// Prefixes sent to this peer: IPv4, IPv6.
    pub sent_v4: u64,
    pub sent_v6: u64,
    /// BFD session state ("up", "down", "init") or "off".
    pub bfd: String,
}

/// Sessions from `show bgp summary json` and `show bfd peers json`, one per configured peer.
pub fn sessions(
    cfg: &BgpConfig,
    summary: &serde_json::Value,
    bfd: &serde_json::Value,
) -> Vec<Session> {
    cfg.peers
        .iter()
        .map(|p| {
            let a = p.address.to_string();
            let v4 = &summary["ipv4Unicast"]["peers"][&a];
            let v6 = &summary["ipv6Unicast"]["peers"][&a];
            let any = if v4.is_object() { v4 } else { v6 };
            let bfd_state = if !p.bfd {
                "off".to_string()
            } else {
                bfd.as_array()
                    .and_then(|l| l.iter().find(|s| s["peer"].as_str() == Some(a.as_str())))
                    .and_then(|s| s["status"].as_str())
                    .unwrap_or("down")
                    .to_string()
            };
            Session {
                peer: a.clone(),
                asn: p.asn,
                description: p.description.clone(),
                state: any["state"].as_str().unwrap_or("unknown").to_string(),
                uptime: any["peerUptime"].as_str().unwrap_or("-").to_string(),
                sent_v4: v4["pfxSnt"].as_u64().unwrap_or(0),
                sent_v6: v6["pfxSnt"].as_u64().unwrap_or(0),
                bfd: bfd_state,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BgpConfig {
        toml::from_str(
            r#"
asn = 65001
router_id = "10.0.0.11"
communities = ["65001:100", "no-export"]
[bfd]
transmit_ms = 50
receive_ms = 50
multiplier = 4
[[peers]]
address = "10.0.0.1"
asn = 65000
[[peers]]
address = "fd00::1"
asn = 65000
bfd = false
description = "tor-b"
"#,
        )
        .unwrap()
    }

    #[test]
    fn renders_policies_bfd_and_peers() {
        let vips = ["10.9.0.5".parse().unwrap(), "fd09::5".parse().unwrap()];
        let c = render(None, &cfg(), &vips);
        let has = |s: &str| assert!(c.iter().any(|l| l == s), "missing {s:?} in {c:#?}");
        has("ip prefix-list lb-vips-v4 seq 5 permit 10.9.0.5/32");
        has("ipv6 prefix-list lb-vips-v6 seq 5 permit fd09::5/128");
        has("set community 65001:100 no-export");
        has("route-map lb-import deny 10");
        has("detect-multiplier 4");
        has("transmit-interval 50");
        has("router bgp 65001");
        has("bgp router-id 10.0.0.11");
        has("neighbor 10.0.0.1 bfd profile lb");
        has("no neighbor fd00::1 bfd");
        has("neighbor fd00::1 description tor-b");
        has("redistribute kernel route-map lb-announce");
        has("neighbor 10.0.0.1 route-map lb-announce out");
        // Nothing in use is deleted: no `no route-map`, no `no ... prefix-list` here.
        assert!(
            !c.iter()
                .any(|l| l.starts_with("no route-map") || l.contains("no ip prefix-list"))
        );
        assert!(!c.iter().any(|l| l.starts_with("no router bgp")));
    }

    #[test]
    fn reload_removes_dropped_peers_and_replaces_a_changed_as() {
        let old = cfg();
        let mut new = cfg();
        new.peers.pop();
        let c = render(Some(&old), &new, &[]);
        assert!(c.iter().any(|l| l == "no neighbor fd00::1"), "{c:#?}");
        new.asn = 65002;
        let c = render(Some(&old), &new, &[]);
        assert_eq!(c[0], "no router bgp 65001");
        assert!(
            !c.iter().any(|l| l == "no neighbor fd00::1"),
            "the old instance is gone whole"
        );
    }

    /// What FRR 8.4 prints after lbd configured it (`show running-config`, abridged).
    const RUNNING: &str = "frr version 8.4.4
hostname lb1
ip prefix-list lb-vips-v4 seq 5 permit 10.9.0.5/32
ip prefix-list lb-vips-v4 seq 100000 deny any
ipv6 prefix-list lb-vips-v6 seq 100000 deny any
route-map lb-announce permit 10
 match ip address prefix-list lb-vips-v4
exit
route-map lb-announce permit 20
 match ipv6 address prefix-list lb-vips-v6
exit
route-map lb-import deny 10
exit
router bgp 65001
 neighbor 10.0.0.1 remote-as 65000
 neighbor 10.0.0.1 bfd profile lb
 !
 address-family ipv4 unicast
  redistribute kernel route-map lb-announce
  neighbor 10.0.0.1 route-map lb-import in
  neighbor 10.0.0.1 route-map lb-announce out
 exit-address-family
exit
bfd
 profile lb
  transmit-interval 100
 exit
exit
";

    #[test]
    fn lbds_own_objects_are_verified_not_just_the_instance() {
        let mut c = cfg();
        c.peers.truncate(1);
        c.peers[0].address = "10.0.0.1".parse().unwrap();
        c.peers[0].asn = 65000;
        c.asn = 65001;
        assert_eq!(missing_objects(RUNNING, &c), Vec::<String>::new());
        // FRR restarted with the operator's own section of the same AS: the instance line is
        // there, lbd's policies and neighbours are not.
        let operator = "hostname lb1\nrouter bgp 65001\n bgp router-id 10.0.0.11\nexit\n";
        let missing = missing_objects(operator, &c);
        assert!(!missing.contains(&"router bgp 65001".to_string()));
        assert!(missing.contains(&"route-map lb-announce permit 10".to_string()));
        assert!(missing.contains(&"neighbor 10.0.0.1 route-map lb-announce out".to_string()));
        // One object lost (a route-map deleted by hand) is enough to re-apply.
        let no_import = RUNNING.replace("route-map lb-import deny 10\n", "");
        assert_eq!(
            missing_objects(&no_import, &c),
            vec!["route-map lb-import deny 10".to_string()]
        );
        // Another peer added to the config but not to FRR.
        let mut more = c.clone();
        more.peers.push(crate::bgp::config::PeerConfig {
            address: "10.0.0.2".parse().unwrap(),
            ..c.peers[0].clone()
        });
        assert_eq!(missing_objects(RUNNING, &more).len(), 2);
    }

    #[test]
    fn stale_prefix_list_entries_are_removed() {
        let running = "!\nip prefix-list lb-vips-v4 seq 5 permit 10.9.0.5/32\nip prefix-list lb-vips-v4 seq 10 permit 10.9.0.6/32\nip prefix-list lb-vips-v4 seq 100000 deny any\nip prefix-list other seq 5 permit 10.0.0.0/8\nipv6 prefix-list lb-vips-v6 seq 5 permit fd09::9/128\n";
        let wanted = prefix_list_entries(&["10.9.0.5".parse().unwrap()]);
        assert_eq!(
            stale_entries(running, &wanted),
            [
                "no ip prefix-list lb-vips-v4 seq 10 permit 10.9.0.6/32",
                "no ipv6 prefix-list lb-vips-v6 seq 5 permit fd09::9/128"
            ]
        );
    }

    #[test]
    fn sessions_from_frr_json() {
        let summary = serde_json::json!({
            "ipv4Unicast": {"peers": {"10.0.0.1": {"state": "Established", "peerUptime": "00:01:02", "pfxSnt": 1}}},
            "ipv6Unicast": {"peers": {"10.0.0.1": {"state": "Established", "pfxSnt": 2}}}
        });
        let bfd = serde_json::json!([{"peer": "10.0.0.1", "status": "up"}]);
        let s = sessions(&cfg(), &summary, &bfd);
        assert_eq!(s[0].state, "Established");
        assert_eq!((s[0].sent_v4, s[0].sent_v6), (1, 2));
        assert_eq!(s[0].bfd, "up");
        assert_eq!(s[1].state, "unknown");
        assert_eq!(s[1].bfd, "off");
    }
}
