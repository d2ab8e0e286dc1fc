//! Membership that follows the cluster: lbd nodes announce themselves to each other, so a node
//! that joins (a MachineSet scale-up, a replaced machine) is taken as a VRRP peer and a sync
//! peer by the others within an announcement's round trip, before it can ever become master,
//! with no re-render and no restart (see docs/architecture.md, "Membership").
//!
//! The rendered peer lists are the floor: a node always sends to and hears the peers its file
//! names. On top of them, each node learns the nodes that announce themselves with the cluster
//! key: every `announce_ms` an lbd sends each node it knows (floor and learned) a signed
//! datagram naming its VRRP instances (VRID, source address) and whether it syncs; a receiver
//! adds the sender to each of its own instances of the same VRID and family, and as a sync
//! peer when they share a VRID. A node that stops says so (it leaves at once); one that goes
//! silent leaves after `expire_ms`. A starting node holds its VRRP instances back until every
//! floor peer has answered (or `join_wait_ms`): by then they send it their adverts, so it
//! never elects itself beside a master that does not know it.
//!
//! Pure parts only: the section (`config`, `lb_core::config::members`), the signed datagram (`wire`) and who is a member
//! now (`roster`). The task that sends and receives is `daemon/members.rs`.

pub use lb_core::config::members as config;
pub mod roster;
pub mod wire;
