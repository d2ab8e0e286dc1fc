//! Fate sharing: when we take over an instance because its master went silent (our
//! master-down timer expired, not a priority-0 resignation), that node is most likely dead,
//! and so are the backends at its address. They take no new flows from now on instead of
//! after their health checks fail; they come back through the normal rise count. The report
//! reaches the owner before the mastership it caused (`daemon/vrrp.rs`), so this node forwards
//! only once they are out. What the report does to the backends' facts is decided by
//! `lb_core::backends` (with the hold of a failed checked backend, from the same rules).

use std::net::IpAddr;

use anyhow::Result;

use super::owner::Owner;
use crate::plan;
use lb_core::backends::Input;

impl Owner {
    /// The master `peer` of `instance` died: its backends leave every VIP's table now (no new
    /// flows; established flows stay for the hold, see `lb_core::backends`).
    pub(super) fn peer_failed(&mut self, instance: &str, peer: IpAddr) -> Result<()> {
        let pairs = plan::fate_shared(&self.cfg, peer);
        self.backend_input(Input::DeadMaster {
            instance: instance.to_string(),
            peer,
            pairs,
        })
    }
}
