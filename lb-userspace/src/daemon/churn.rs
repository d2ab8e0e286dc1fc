//! Interface churn for the data plane: when the interface is deleted and comes back (an OVS
//! bridge such as br-ex rebuilt, a NIC re-plugged) it has a new index and no XDP program. The
//! pinned link still points at the deleted device, so it is dropped and the program attached
//! afresh, here while running and at start-up (so a restart never fails on a stale pin).
//! VRRP instances follow the interface themselves (fault while gone, sockets rebound).

use std::{path::Path, sync::atomic::Ordering::SeqCst};

use anyhow::Result;

use super::Daemon;
use crate::{dataplane::LoadOptions, netlink::Link};

/// Every this many refreshes (about seconds) the interface's XDP attachment is checked through
/// netlink even when its index did not change.
const FULL_CHECK_EVERY: u64 = 10;

/// Where the data plane pins the XDP link for `interface`.
pub fn link_pin(opts: &LoadOptions, interface: &str) -> std::path::PathBuf {
    opts.pin_dir().join(format!("link_{interface}"))
}

/// Remove a pinned link that no longer drives the interface (the device it was attached to
/// was deleted: `interface` now has no XDP program). True if one was removed.
pub fn drop_stale_link_pin(pin: &Path, link: &Link) -> Result<bool> {
    if link.xdp_attached || !pin.exists() {
        return Ok(false);
    }
    std::fs::remove_file(pin)?;
    tracing::warn!(interface = %link.name, pin = %pin.display(), "pinned XDP link belongs to a deleted device; attaching afresh");
    Ok(true)
}

impl Daemon {
    /// Compare the interface with what the data plane is attached to; re-attach after the
    /// interface was recreated (new index) or lost its program. Called from `refresh`.
    pub(super) async fn follow_interface(&self) -> Result<()> {
        let (iface, ifindex) = {
            let g = self.inner.lock().await;
            (g.cfg.interface.clone(), g.ifindex)
        };
        // Cheap check first (no netlink dump): same device as before, attached when last
        // looked. The full check runs every FULL_CHECK_EVERY refreshes or on a change.
        let n = self.churn_checks.fetch_add(1, SeqCst);
        if crate::vrrp::io::if_index(&iface).ok() == Some(ifindex)
            && self.attached.load(SeqCst)
            && !n.is_multiple_of(FULL_CHECK_EVERY)
        {
            return Ok(());
        }
        let link = match self.netlink.link(&iface).await {
            Ok(l) => l,
            Err(_) => {
                // Gone: nothing to forward on; VRRP instances are in fault meanwhile.
                if self.attached.swap(false, SeqCst) {
                    tracing::warn!(interface = %iface, "interface gone; waiting for it to come back");
                }
                return Ok(());
            }
        };
        let mut g = self.inner.lock().await;
        if link.index == g.ifindex && link.xdp_attached {
            self.attached.store(true, SeqCst);
            return Ok(());
        }
        let opts = g.dp.options().clone();
        drop_stale_link_pin(&link_pin(&opts, &iface), &link)?;
        let mode = g.cfg.xdp_mode;
        if let Err(e) = g.dp.attach(&iface, mode) {
            self.attached.store(false, SeqCst);
            return Err(e.context(format!("re-attach XDP to the recreated {iface}")));
        }
        tracing::info!(interface = %iface, old = g.ifindex, new = link.index, "XDP program attached to the recreated interface");
        g.ifindex = link.index;
        g.facts.if_mac = link.mac;
        self.attached.store(true, SeqCst);
        g.apply()
    }
}
