//! Names of the pinned maps (also the names in the BPF object).
pub const CONFIG: &str = "LB_CONFIG";
pub const VIPS: &str = "LB_VIPS";
pub const VIP_ADDRS: &str = "LB_VIP_ADDRS";
pub const BACKENDS: &str = "LB_BACKENDS";
pub const TABLES: &str = "LB_TABLES";
pub const NEW_TABLES: &str = "LB_NEW_TABLES";
pub const CONNTRACK: &str = "LB_CONNTRACK";
pub const STATS: &str = "LB_STATS";
pub const VIP_STATS: &str = "LB_VIP_STATS";
pub const BACKEND_STATS: &str = "LB_BACKEND_STATS";
pub const VIP_OWNED: &str = "LB_VIP_OWNED";
pub const PEERS: &str = "LB_PEERS";
pub const FLOOD: &str = "LB_FLOOD_NODE";
pub const HANDSHAKES: &str = "LB_HANDSHAKES";
/// Versioned: a cache laid out by another `flow_cache_hash` or line layout (`FlowCacheLine`)
/// must never be adopted (its entries would sit in the wrong slots or be misread). Change
/// either, change the version.
pub const FLOW_CACHE: &str = "LB_FLOW_CACHE_V3";
/// The previous flow cache (one 64-byte entry per slot, not page-aligned): its entries are
/// written back to the connection table when a new version starts, then its pin goes.
pub const FLOW_CACHE_V2: &str = "LB_FLOW_CACHE_V2";
pub const DECAP_PEERS: &str = "LB_DECAP_PEERS";
pub const DECAP_STATS: &str = "LB_DECAP_STATS";
pub const DECAP_VIPS: &str = "LB_DECAP_VIPS";
pub const DECAP_LOCAL: &str = "LB_DECAP_LOCAL";
/// The backends' decapsulation program.
pub const DECAP_PROGRAM: &str = "lb_decap";
/// Pins of maps earlier versions had and this one does not.
pub const OBSOLETE: &[&str] = &["LB_VIP_GEN", "LB_FLOOD", "LB_FLOW_CACHE", FLOW_CACHE_V2];
/// The XDP program's name in the object.
pub const PROGRAM: &str = "lb_xdp";
/// Socket load balancing (see `SockConfig`).
pub const SOCK_CONFIG: &str = "LB_SOCK_CONFIG";
pub const SOCK_REV: &str = "LB_SOCK_REV";
pub const SOCK_STATS: &str = "LB_SOCK_STATS";
/// The cgroup programs of socket load balancing, by attach point.
pub const SOCK_PROGRAMS: &[&str] = &[
    "lb_sock_connect4",
    "lb_sock_connect6",
    "lb_sock_sendmsg4",
    "lb_sock_sendmsg6",
    "lb_sock_recvmsg4",
    "lb_sock_recvmsg6",
    "lb_sock_getpeername4",
    "lb_sock_getpeername6",
];
