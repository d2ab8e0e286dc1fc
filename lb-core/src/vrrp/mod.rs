//! VRRP without I/O: the wire codec, the RFC state machine and the tracked checks' weights. The sockets, the instance task
//! and VIP announcement are in `lb-userspace`'s `vrrp` module.
//!
//! - [`codec`]: encode/decode adverts (v2 and v3) and the drop reasons (std-only).
//! - [`state`]: the RFC 3768 / RFC 9568 state machine as a function of (state, event, time).
//! - [`hold`]: beside it, what a master does with its VIPs: wait for the data plane to forward,
//!   hold them, announce them in bursts, give them back.
//! - [`track`]: tracked checks' weights and FAULT, keepalived's rules.
//! - [`vrids`]: the VRIDs OpenShift derives from a cluster name.

pub mod codec;
pub mod hold;
pub mod state;
pub mod track;
pub mod vrids;
