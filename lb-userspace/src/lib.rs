//! lb user space: the daemon's parts, one concern per module. `lbd` wires them together; `lbctl`
//! only talks to the API.
//!
//! - [`config`]: the TOML config and its validation (pure, `lb_core::config`); reading it on
//!   this node ([`config::node`]).
//! - [`maglev`]: the weighted Maglev table builder (pure).
//! - [`desired`]: what the data plane should hold, as plain values (pure, `lb_core::desired`).
//! - [`dataplane`]: loads and attaches the XDP program; the only writer of its maps.
//! - [`net`]: the host's network: interfaces and addresses, VIP addresses, links, neighbours and
//!   routes (rtnetlink, getifaddrs); depends on no protocol module.
//! - [`vrrp`]: VRRP codec, pure state machine, socket I/O and VIP announcements (GARP/NA).
//! - [`bgp`]: active-active VIPs announced over BGP ECMP through FRR.
//! - [`health`]: backend health checks (HTTPS, HTTP, TCP) with rise/fall.
//! - [`plan`]: from config and facts to what the data plane should do (pure, `lb_core::plan`).
//! - [`render`]: every node's config from one cluster description (pure, `lb_core::render`;
//!   `lbctl render`).
//! - [`config_watch`]: reload on a config file change; wait for a node's config to appear.
//! - [`daemon`]: `lbd`'s core: one owner task holding the state, and the parts around it.
//! - [`decap`]: `lbd decap`, the run mode of a routed backend (unwraps IP-in-IP for its VIPs).
//! - [`guardian`]: gives the VRRP VIPs back (and withdraws BGP routes) if lbd dies.
//! - [`handover`]: the grace after a VIP leaves this node (pure).
//! - [`static_vip`]: VIPs owned without VRRP: on the interface and announced.
//! - [`explain`]: `lbctl explain`'s question, frame and answer (pure; the program decides).
//! - [`status`]: the status rows lbctl shows and metrics export.
//! - [`metrics`]: Prometheus metrics (prometheus-client).
//! - [`metrics_tls`]: the HTTPS /metrics listener with client-certificate authentication.
//! - [`sync`]: connection sync between LB nodes: its config, datagram and replay window (pure),
//!   and the reading of its key files.
//! - [`api`]: the JSON HTTP API over a unix socket (server and the client lbctl uses).

pub mod api;
pub mod bgp;
pub mod config;
pub mod config_watch;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub use lb_core::desired;
pub mod explain;
pub mod guardian;
pub use lb_core::handover;
pub mod health;
pub use lb_core::maglev;
pub mod members;
pub mod metrics;
pub mod metrics_tls;
pub mod net;
pub use lb_core::plan;
pub use lb_core::render;
pub mod static_vip;
pub mod status;
pub mod sync;
pub mod vrrp;

/// The XDP object built by build.rs (empty when built without the eBPF toolchain).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb"));
/// The benches' programs (the baseline, the traffic generator, ...), apart from the data plane's.
pub static BENCH_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-bench"));
