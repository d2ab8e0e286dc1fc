//! Interface churn for the data plane: when the interface is deleted and comes back (an OVS
//! bridge such as br-ex rebuilt, a NIC re-plugged) it has a new index and no XDP program. The
//! pinned link still points at the deleted device, so it is dropped and the program attached
//! afresh, here while running and at start-up (so a restart never fails on a stale pin).
//! The static VIPs are put back on the new device. VRRP instances follow the interface
//! themselves (fault while gone, sockets rebound).

use std::path::Path;

use std::time::Instant;

use anyhow::Result;
use lb_core::controller::Input;

use super::owner::Owner;
use crate::{dataplane::LoadOptions, net::Link};

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

impl Owner {
    /// Whether the next gather should look the interface up through netlink: the cheap
    /// check (same index, attached when last looked) failed, or the periodic full check is due.
    pub(super) fn link_check_due(&mut self) -> bool {
        self.churn_checks += 1;
        !(crate::net::iface::if_index(&self.cfg.interface).ok() == Some(self.ifindex)
            && self.ctl.attached()
            && !self.churn_checks.is_multiple_of(FULL_CHECK_EVERY))
    }

    /// Compare the interface with what the data plane is attached to; re-attach after the
    /// interface was recreated (new index) or lost its program, and put the static VIPs back
    /// on the new device (they went with the old one).
    pub(super) async fn follow_interface(&mut self, link: Result<Link>) -> Result<()> {
        let iface = self.cfg.interface.clone();
        let link = match link {
            Ok(l) => l,
            Err(_) => {
                // Gone: nothing to forward on; VRRP instances are in fault meanwhile.
                if self.ctl.attached() {
                    self.attached(false);
                    tracing::warn!(interface = %iface, "interface gone; waiting for it to come back");
                }
                return Ok(());
            }
        };
        // With `xdp_interfaces` the program is on other devices: `interface` has none.
        let attach_here = self.cfg.xdp_interfaces.is_empty();
        if link.index == self.ifindex && (link.xdp_attached || !attach_here) {
            self.attached(true);
            return Ok(());
        }
        if attach_here {
            let opts = self.dp.options().clone();
            drop_stale_link_pin(&link_pin(&opts, &iface), &link)?;
            if let Err(e) = self.dp.attach(&iface, self.cfg.xdp_mode) {
                self.attached(false);
                return Err(e.context(format!("re-attach XDP to the recreated {iface}")));
            }
            tracing::info!(interface = %iface, old = self.ifindex, new = link.index, "XDP program attached to the recreated interface");
        }
        let recreated = link.index != self.ifindex;
        self.ifindex = link.index;
        self.facts.if_mac = link.mac;
        self.attached(true);
        if recreated {
            self.readd_static_vips();
        }
        self.apply()
    }

    fn attached(&mut self, attached: bool) {
        self.ctl.handle(Instant::now(), Input::Attached(attached));
    }

    /// The interface was recreated: its addresses went with the old device, and the static
    /// VIPs' announcer was bound to it. Hold them afresh (beside the owner, see `netexec`).
    fn readd_static_vips(&mut self) {
        let want = crate::static_vip::static_vips(&self.cfg);
        let answer = self
            .netexec
            .ask(super::netexec::Request::StaticVips { want, fresh: true });
        tokio::spawn(async move {
            if let Ok(Err(e)) = answer.await {
                tracing::error!(error = %e, "static VIPs on the recreated interface");
            }
        });
    }
}
