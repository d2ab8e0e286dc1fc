//! Counter indexes and names: the XDP program's (`stat`), the backends' unwrapping
//! (`decap_stat`) and socket load balancing's (`sock_stat`).

/// Global counters, one per verdict and per pass/drop reason, indexes into `LB_STATS`.
pub mod stat {
    pub const VERDICT_PASS: u32 = 0;
    pub const VERDICT_DROP: u32 = 1;
    pub const VERDICT_TX: u32 = 2;
    pub const VERDICT_REDIRECT: u32 = 3;
    /// Not IPv4/IPv6, or not addressed to a VIP service.
    pub const PASS_NOT_VIP: u32 = 4;
    /// A VIP this node does not own: the local stack serves it (e.g. as a DSR backend).
    pub const PASS_NOT_OWNER: u32 = 5;
    /// The chosen backend is this node.
    pub const PASS_LOCAL_BACKEND: u32 = 6;
    /// Truncated frame or impossible header field (e.g. IPv4 IHL < 5).
    pub const PASS_MALFORMED: u32 = 7;
    /// More IPv6 extension headers than we walk.
    pub const PASS_IPV6_EXT_LIMIT: u32 = 8;
    /// ICMP error that does not embed a VIP flow.
    pub const PASS_ICMP_NOT_VIP: u32 = 9;
    /// The VIP's table is empty.
    pub const DROP_NO_BACKEND: u32 = 10;
    /// A fragment of a datagram to a VIP address (see docs/architecture.md).
    pub const DROP_FRAGMENT: u32 = 11;
    /// A table slot names a backend that is not in the set (user space mid-update); never forward.
    pub const DROP_BAD_BACKEND: u32 = 12;
    pub const CONNTRACK_HIT: u32 = 13;
    pub const CONNTRACK_MISS: u32 = 14;
    /// A connection-table entry whose backend left the set, or a SYN on an entry whose
    /// connection the client closed (a reused 5-tuple): the flow is hashed again.
    pub const CONNTRACK_STALE: u32 = 15;
    /// ICMP "fragmentation needed" / "packet too big" sent on to a flow's backend.
    pub const ICMP_FORWARDED: u32 = 16;
    /// Sent to a remote backend (XDP_TX or redirect).
    pub const FORWARDED: u32 = 17;
    /// Loop guard: a VIP packet whose source MAC is another lbd node's (a VRRP peer or a
    /// backend) was already forwarded once; it goes to the local stack.
    pub const PASS_FROM_PEER: u32 = 18;
    /// A SYN forwarded in flood mode without writing a connection-table entry (a SYN that
    /// skipped a slot taking no new flows is remembered in the small handshake table instead).
    pub const SYN_FLOOD_UNTRACKED: u32 = 19;
    /// Forwarded to a routed backend inside an outer IP header (also counted as `FORWARDED`).
    pub const ENCAPSULATED: u32 = 20;
    /// Too big to wrap for a routed backend's path: an ICMP "fragmentation needed" / "packet
    /// too big" went back to the client instead.
    pub const ENCAP_TOO_BIG: u32 = 21;
    /// The frame could not be grown or shrunk for encapsulation (a driver without headroom).
    pub const DROP_ENCAP: u32 = 22;
    /// A packet other than a SYN without a connection-table entry (a TCP segment or a UDP
    /// datagram of a flow the table does not hold), forwarded in flood mode without writing one.
    pub const FLOOD_UNTRACKED: u32 = 23;
    pub const COUNT: u32 = 24;

    /// Names in index order, used by user space for `lbctl stats` and metrics.
    pub const NAMES: [&str; COUNT as usize] = [
        "verdict_pass",
        "verdict_drop",
        "verdict_tx",
        "verdict_redirect",
        "pass_not_vip",
        "pass_not_owner",
        "pass_local_backend",
        "pass_malformed",
        "pass_ipv6_ext_limit",
        "pass_icmp_not_vip",
        "drop_no_backend",
        "drop_fragment",
        "drop_bad_backend",
        "conntrack_hit",
        "conntrack_miss",
        "conntrack_stale",
        "icmp_forwarded",
        "forwarded",
        "pass_from_peer",
        "syn_flood_untracked",
        "encapsulated",
        "encap_too_big",
        "drop_encap",
        "flood_untracked",
    ];
}

/// `LB_DECAP_STATS` counters (one per-CPU entry). `lb_decap` unwraps an IP-in-IP packet only
/// when its outer source is a known LB node (`LB_DECAP_PEERS`), its outer destination one of
/// this host's addresses (`LB_DECAP_LOCAL`), its headers add up, and its inner destination one
/// of the VIPs served here (`LB_DECAP_VIPS`). An LB node only ever wraps VIP traffic to its
/// backends, so an LB node's packet that fails any of these is forged: dropped, never handed to
/// a stack that could route its inner packet on.
pub mod decap_stat {
    /// Unwrapped and passed to the stack.
    pub const DECAPSULATED: u32 = 0;
    /// IP-in-IP from a source that is not a known LB node: passed unchanged (another tunnel's
    /// traffic is the kernel's business).
    pub const NOT_FROM_PEER: u32 = 1;
    /// IP-in-IP from an LB node whose headers do not add up (lengths, options, fragments), or
    /// behind IPv6 extension headers (an LB node sends none; such a chain is not checked like a
    /// bare header), or an LB node's IPv6 packet whose extension headers cannot be walked:
    /// dropped.
    pub const MALFORMED: u32 = 2;
    /// Anything else: passed unchanged.
    pub const PASSED: u32 = 3;
    /// IP-in-IP from an LB node whose outer destination is not this host's: dropped.
    pub const NOT_LOCAL: u32 = 4;
    /// IP-in-IP from an LB node whose inner destination is not a VIP served here: dropped.
    pub const NOT_VIP: u32 = 5;
    /// Outer header marked CE around a packet that is not ECN-capable: dropped (RFC 6040 4.2:
    /// the congestion signal cannot be passed on).
    pub const ECN_DROP: u32 = 6;
    /// IP-in-IP from an LB node whose inner packet is not TCP, UDP or ICMP, or is a fragment:
    /// dropped (an LB node wraps nothing else; a tunnel nested inside would reach any tunnel
    /// device that is up on the backend).
    pub const INNER_PROTO: u32 = 7;
    pub const COUNT: u32 = 8;
    pub const NAMES: [&str; COUNT as usize] = [
        "decapsulated",
        "not_from_peer",
        "malformed",
        "passed",
        "not_local",
        "not_vip",
        "ecn_drop",
        "inner_proto",
    ];
}

/// `LB_SOCK_STATS` counters (one per-CPU entry).
pub mod sock_stat {
    /// A connect() or an unconnected send to a VIP service got a backend.
    pub const BALANCED: u32 = 0;
    /// A VIP service without a backend taking new connections: left to the local stack, as
    /// without the hooks.
    pub const NO_BACKEND: u32 = 1;
    /// The chosen backend's family is not the socket's (a routed backend of the other family):
    /// left to the local stack.
    pub const FAMILY_MISMATCH: u32 = 2;
    /// getpeername() or a received datagram showed the VIP instead of the backend.
    pub const REVERSED: u32 = 3;
    pub const COUNT: u32 = 4;
    pub const NAMES: [&str; COUNT as usize] =
        ["balanced", "no_backend", "family_mismatch", "reversed"];
}
