//! Path MTU for wrapped packets. A router on a routed backend's path that cannot forward a
//! wrapped packet answers the LB node with ICMP "fragmentation needed" / "packet too big" quoting
//! the outer header. The kernel learns a path MTU from such an error (a route exception for the
//! backend, which `Netlink::route_to` reads) only if a socket of the quoted protocol takes it:
//! without an IP-in-IP tunnel module nothing does. Raw sockets of protocols 4 and 41 do (the
//! kernel updates the path MTU for any raw socket matching the quoted packet); they receive
//! nothing else (a filter drops every packet queued to them).

use socket2::{Domain, Protocol, Socket, Type};

/// The sockets, open for as long as this value lives.
pub struct PmtuListeners {
    _sockets: Vec<Socket>,
}

impl PmtuListeners {
    /// Open what this host allows (IPv6 may be off); never fails the caller.
    pub fn open() -> PmtuListeners {
        let mut sockets = Vec::new();
        for domain in [Domain::IPV4, Domain::IPV6] {
            for proto in [libc::IPPROTO_IPIP, libc::IPPROTO_IPV6] {
                match listener(domain, proto) {
                    Ok(s) => sockets.push(s),
                    Err(e) => tracing::debug!(?domain, proto, error = %e, "no path-MTU listener"),
                }
            }
        }
        PmtuListeners { _sockets: sockets }
    }
}

fn listener(domain: Domain, proto: i32) -> std::io::Result<Socket> {
    let s = Socket::new(domain, Type::RAW, Some(Protocol::from(proto)))?;
    // Accept nothing into the queue: the socket is there for the errors' side effect only.
    s.attach_filter(&[socket2::SockFilter::new(
        (libc::BPF_RET | libc::BPF_K) as u16,
        0,
        0,
        0,
    )])?;
    s.set_recv_buffer_size(0)?;
    Ok(s)
}
