//! VRRP: the wire codec, a pure state machine, socket I/O and VIP announcement.
//!
//! - [`codec`]: encode/decode adverts (v2 and v3) and the drop reasons (pure, std-only).
//! - [`state`]: the RFC 3768 / RFC 9568 state machine as a pure function of (state, event, time).
//! - [`hold`]: the hold/announce machine beside it: forwarding first, then the VIPs and their
//!   announcements (pure).
//! - [`collision`]: VRID collision bookkeeping (pure).
//! - [`admission`]: who may vote: the receive policy every advert passes (pure).
//! - [`limiter`]: one WARN per peer and reason per interval (pure).
//! - [`split_brain`]: dual-master episodes, not ordinary preemptions (pure).
//! - [`config`]: one instance's configuration and its validation (pure;
//!   `lb_core::config::vrrp`).
//! - [`group`]: instances that move together, keepalived's sync groups (pure).
//! - [`track`]: tracked checks' weights and FAULT, keepalived's rules (pure;
//!   `lb_core::vrrp::track`).
//! - [`vrids`]: the VRIDs OpenShift derives from a cluster name (pure; `lb_core::vrrp::vrids`).
//! - [`io`]: raw VRRP sockets (tokio `AsyncFd`), TTL checks, interface facts.
//! - [`announce`]: VIP add/remove (rtnetlink), gratuitous ARP and unsolicited NA.
//! - [`instance`]: one instance as a task on its own thread; its config, handle and status.
//! - [`realtime`]: real-time scheduling (`SCHED_RR`) for an instance's thread.

pub mod admission;
pub mod announce;
pub use lb_core::vrrp::codec;
pub use lb_core::vrrp::hold;
pub mod collision;
pub use lb_core::config::vrrp as config;
pub mod group;
pub mod instance;
pub mod io;
pub mod limiter;
pub mod realtime;
pub mod split_brain;
pub use lb_core::vrrp::state;
pub use lb_core::vrrp::track;
pub use lb_core::vrrp::vrids;

pub use config::InstanceConfig;
pub use instance::{Instance, InstanceStatus};
