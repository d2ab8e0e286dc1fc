//! Active-active VIPs over BGP ECMP, through FRR (lbd never speaks BGP itself).
//!
//! - [`config`]: the `[[bgp]]` section and its validation (pure; `lb_core::config::bgp`).
//! - [`decide`]: which VIP host routes this node announces and why the others are withdrawn
//!   (pure).
//! - [`frr`]: FRR's configuration for the section (pure rendering) and the vtysh driver.
//! - [`routes`]: the announcement itself, a kernel route FRR redistributes.
//!
//! [`Announcer`] is the one owner of those side effects: the daemon hands it the config and the
//! plan's backend rows, it converges the kernel routes (and FRR's config on start and reload).

pub use lb_core::config::bgp as config;
pub mod decide;
pub mod frr;
pub mod routes;

use std::{collections::BTreeSet, future::Future, net::IpAddr};

use anyhow::Result;
use serde::Serialize;

pub use config::{BfdConfig, BgpConfig, PeerConfig};
pub use decide::{NodeState, PrefixDecision};

use crate::plan::BackendPlan;

pub use lb_core::config::bgp::BgpVip;

/// The BGP VIP addresses, each once, in config order.
pub fn bgp_addresses(vips: &[BgpVip]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for v in vips {
        if !out.contains(&v.address) {
            out.push(v.address);
        }
    }
    out
}

/// Where `lbctl bgp drain` is remembered, next to the API socket (`/run/lbd/lbd.bgp-drained`):
/// a drained node stays drained when lbd restarts (an upgrade during maintenance), not across
/// a reboot (/run is emptied).
pub fn drain_marker(api_socket: &std::path::Path) -> std::path::PathBuf {
    api_socket.with_extension("bgp-drained")
}

/// `lbctl bgp status`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Status {
    pub enabled: bool,
    pub asn: Option<u32>,
    pub node_drained: bool,
    pub sessions: Vec<frr::Session>,
    /// Why sessions could not be read (FRR not running, vtysh missing...).
    pub sessions_error: Option<String>,
    pub prefixes: Vec<PrefixStatus>,
    /// BFD detection time of this node's side, ms.
    pub bfd_detect_ms: Option<u32>,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct PrefixStatus {
    pub prefix: String,
    pub vips: Vec<String>,
    /// The decision.
    pub announce: bool,
    /// The announcement route is in the kernel (what FRR redistributes).
    pub installed: bool,
    pub reason: String,
}

pub struct Announcer {
    handle: rtnetlink::Handle,
    /// The section FRR was last configured with.
    applied: Option<BgpConfig>,
    node: NodeState,
    decisions: Vec<PrefixDecision>,
    installed: BTreeSet<IpAddr>,
    last_error: Option<String>,
}

impl Announcer {
    pub fn new(handle: rtnetlink::Handle) -> Self {
        Announcer {
            handle,
            applied: None,
            node: NodeState::default(),
            decisions: Vec::new(),
            installed: BTreeSet::new(),
            last_error: None,
        }
    }

    /// FRR has been configured (by this lbd) with a `[[bgp]]` section.
    pub fn is_configured(&self) -> bool {
        self.applied.is_some()
    }

    pub fn node(&self) -> NodeState {
        self.node
    }

    pub fn set_drained(&mut self, drained: bool) {
        self.node.drained = drained;
    }

    /// Start drained (a previous lbd left the drain marker).
    pub fn with_drained(mut self, drained: bool) -> Self {
        self.node.drained = drained;
        self
    }

    /// Whether the data plane is attached: a detached node withdraws every prefix.
    pub fn set_detached(&mut self, detached: bool) {
        self.node.detached = detached;
    }

    pub fn set_stopping(&mut self) {
        self.node.stopping = true;
    }

    /// The vtysh work that brings FRR's configuration to the config's `[[bgp]]` section
    /// (`new`, none to remove lbd's) for its BGP VIPs (start and reload), as a future that owns
    /// its inputs: the BGP worker runs it beside route syncs, so a slow FRR (up to 10 s a vtysh
    /// call) never delays a withdrawal. `None`: nothing to do. Its result goes to
    /// [`Announcer::configured`].
    pub fn configure_job(
        &self,
        new: Option<&BgpConfig>,
        vips: &[BgpVip],
    ) -> Option<impl Future<Output = Result<Option<BgpConfig>>> + Send + 'static> {
        let commands = match (self.applied.as_ref(), new) {
            (_, Some(new)) => frr::render(self.applied.as_ref(), new, &bgp_addresses(vips)),
            (Some(old), None) => frr::render_removal(old),
            (None, None) => return None,
        };
        let vtysh = frr::Vtysh::new(new.or(self.applied.as_ref())?);
        let entries = frr::prefix_list_entries(&bgp_addresses(vips));
        let new = new.cloned();
        Some(async move {
            let running = vtysh.running_config().await?;
            let mut all = frr::stale_entries(&running, &entries);
            all.extend(commands);
            vtysh.configure(&all).await?;
            Ok(new)
        })
    }

    /// A [`Announcer::configure_job`] ended: FRR has that section now, or the error is kept
    /// for the status.
    pub fn configured(&mut self, r: &Result<Option<BgpConfig>>) {
        match r {
            Ok(new) => self.applied = new.clone(),
            Err(e) => self.last_error = Some(format!("{e:#}")),
        }
    }

    /// Decide and converge the kernel routes. Routes of addresses that are no longer BGP VIPs
    /// are removed too.
    pub async fn sync(&mut self, vips: &[BgpVip], rows: &[BackendPlan]) -> Result<()> {
        self.decisions = decide::decide(vips, rows, self.node);
        // The kernel is the truth, not what lbd last did: a route flushed by hand (`ip route
        // flush proto 76`) or by another program is installed again.
        match routes::installed(&self.handle).await {
            Ok(now) => {
                for lost in self.installed.difference(&now) {
                    tracing::warn!(prefix = %lost, "BGP: announcement route gone from the kernel; installing it again");
                }
                self.installed = now;
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "BGP: listing announcement routes"),
        }
        let want: BTreeSet<IpAddr> = self
            .decisions
            .iter()
            .filter(|d| d.announce)
            .map(|d| d.prefix)
            .collect();
        let mut first_err = None;
        for a in want.difference(&self.installed.clone()) {
            match routes::install(&self.handle, *a).await {
                Ok(()) => {
                    tracing::info!(prefix = %a, "BGP: announcing");
                    self.installed.insert(*a);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for a in self.installed.clone().difference(&want) {
            let reason = self
                .decisions
                .iter()
                .find(|d| d.prefix == *a)
                .map(|d| d.reason.clone())
                .unwrap_or_else(|| "no longer a BGP VIP".into());
            match routes::remove(&self.handle, *a).await {
                Ok(()) => {
                    tracing::info!(prefix = %a, %reason, "BGP: withdrawing");
                    self.installed.remove(a);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => {
                self.last_error = Some(format!("{e:#}"));
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// The status without the sessions (see [`sessions`]): cheap, no I/O, so it can be taken
    /// under the lock that withdrawals also need.
    /// `bgp`: the config's `[[bgp]]` section.
    pub fn status(&self, bgp: Option<&BgpConfig>) -> Status {
        Status {
            enabled: bgp.is_some(),
            asn: bgp.map(|b| b.asn),
            node_drained: self.node.drained,
            sessions: Vec::new(),
            sessions_error: None,
            prefixes: self
                .decisions
                .iter()
                .map(|d| PrefixStatus {
                    prefix: format!("{}/{}", d.prefix, d.prefix_len),
                    vips: d.vips.clone(),
                    announce: d.announce,
                    installed: self.installed.contains(&d.prefix),
                    reason: d.reason.clone(),
                })
                .collect(),
            bfd_detect_ms: bgp.map(|b| b.bfd.detect_ms()),
            last_error: self.last_error.clone(),
        }
    }

    /// The section FRR was last configured with.
    pub fn applied(&self) -> Option<BgpConfig> {
        self.applied.clone()
    }

    /// Forget what FRR was configured with (it lost it): the next sync configures it again.
    pub fn mark_unconfigured(&mut self) {
        self.applied = None;
    }
}

/// BGP and BFD sessions as FRR reports them (vtysh; run without holding the announcer).
pub async fn sessions(bgp: Option<&BgpConfig>) -> (Vec<frr::Session>, Option<String>) {
    let Some(b) = bgp else {
        return (Vec::new(), None);
    };
    let v = frr::Vtysh::new(b);
    // Both at once: a hung FRR costs one vtysh timeout, not two.
    let (summary, bfd) = tokio::join!(
        v.show_json("show bgp summary json"),
        v.show_json("show bfd peers json")
    );
    match (summary, bfd) {
        (Ok(s), Ok(f)) => (frr::sessions(b, &s, &f), None),
        (Err(e), _) | (_, Err(e)) => (Vec::new(), Some(format!("{e:#}"))),
    }
}

/// Whether FRR's running config still holds every object lbd configured (it does not after an
/// FRR restart: lbd's configuration lives only in FRR's running config; and an operator's own
/// `router bgp` of the same AS is not lbd's, see [`frr::missing_objects`]).
pub async fn frr_has_instance(applied: BgpConfig) -> Result<bool> {
    let running = frr::Vtysh::new(&applied).running_config().await?;
    let missing = frr::missing_objects(&running, &applied);
    if !missing.is_empty() {
        tracing::warn!(
            ?missing,
            "BGP: lbd's objects missing from FRR's running config"
        );
    }
    Ok(missing.is_empty())
}
