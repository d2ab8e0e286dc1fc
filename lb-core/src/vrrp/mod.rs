//! VRRP without I/O: the wire codec and the RFC state machine. The sockets, the instance task
//! and VIP announcement are in `lb-userspace`'s `vrrp` module.
//!
//! - [`codec`]: encode/decode adverts (v2 and v3) and the drop reasons (std-only).
//! - [`state`]: the RFC 3768 / RFC 9568 state machine as a function of (state, event, time).

pub mod codec;
pub mod state;
