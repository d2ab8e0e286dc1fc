//! VRRP: the wire codec, a pure state machine, socket I/O and VIP announcement.
//!
//! - [`codec`]: encode/decode adverts (v2 and v3) and the drop reasons (pure, std-only).
//! - [`state`]: the RFC 3768 / RFC 9568 state machine as a pure function of (state, event, time).
//! - [`collision`]: VRID collision bookkeeping (pure).
//! - [`vrids`]: the VRIDs OpenShift derives from a cluster name (pure).
//! - [`io`]: raw VRRP sockets (tokio `AsyncFd`), TTL checks, interface facts.
//! - [`announce`]: VIP add/remove (rtnetlink), gratuitous ARP and unsolicited NA.
//! - [`instance`]: one instance as a tokio task; its config, handle and status.

pub mod announce;
pub mod codec;
pub mod collision;
pub mod instance;
pub mod io;
pub mod state;
pub mod vrids;

pub use instance::{ConfigError, Instance, InstanceConfig, InstanceStatus};
