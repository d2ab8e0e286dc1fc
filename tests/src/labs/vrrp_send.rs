//! A VRRP advert sender for labs (a foreign or hostile router): `labnode vrrp-send`. Encodes
//! with lbd's own codec and sends from a raw socket bound to the node's interface, with its own
//! IP header (`IP_HDRINCL`): TTL 255 and the node's address unless the test asks for another TTL
//! or a forged source, so only what the test means to be wrong is wrong.

use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use lb_userspace::vrrp::codec::{self, Advert, Auth, Version};

/// What to send.
#[derive(Clone, Debug)]
pub struct Flood {
    pub ifname: String,
    pub src: Ipv4Addr,
    /// A multicast group (224.0.0.18) or unicast addresses.
    pub dsts: Vec<Ipv4Addr>,
    pub vrid: u8,
    pub priority: u8,
    /// May be empty (an address count of 0).
    pub vips: Vec<Ipv4Addr>,
    /// Packets per second in total; 0: as fast as the socket takes them.
    pub rate: u64,
    pub secs: f64,
    /// VRRPv2 with this password (else VRRPv3).
    pub v2_pass: Option<String>,
    pub interval_cs: u16,
    /// The IP TTL (255 unless testing an off-segment sender).
    pub ttl: u8,
    /// The source written in the IP header (and the v3 checksum): a forged peer's address.
    pub forged_src: Option<Ipv4Addr>,
}

/// Send until the time is up; the number of packets sent.
pub fn run(f: &Flood) -> std::io::Result<u64> {
    // SAFETY: socket(2); checked before being owned.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, 112) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let s = fd.as_raw_fd();
    let set = |level, name, v: i32| {
        // SAFETY: an int option.
        unsafe {
            libc::setsockopt(
                s,
                level,
                name,
                (&v as *const i32).cast(),
                std::mem::size_of::<i32>() as u32,
            )
        }
    };
    set(libc::IPPROTO_IP, libc::IP_HDRINCL, 1);
    let name = std::ffi::CString::new(f.ifname.clone()).unwrap();
    // SAFETY: the name is a valid C string of the stated length.
    unsafe {
        libc::setsockopt(
            s,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            name.as_ptr().cast(),
            f.ifname.len() as u32,
        )
    };
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    let mreq = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr { s_addr: 0 },
        imr_address: libc::in_addr {
            s_addr: u32::from_ne_bytes(f.src.octets()),
        },
        imr_ifindex: index as i32,
    };
    // SAFETY: a valid ip_mreqn.
    unsafe {
        libc::setsockopt(
            s,
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&mreq as *const libc::ip_mreqn).cast(),
            std::mem::size_of::<libc::ip_mreqn>() as u32,
        )
    };
    let (version, auth) = match &f.v2_pass {
        Some(p) => (Version::V2, Auth::simple(p)),
        None => (Version::V3, Auth::None),
    };
    let advert = Advert {
        version,
        vrid: f.vrid,
        priority: f.priority,
        interval_cs: f.interval_cs,
        addrs: f.vips.iter().map(|a| IpAddr::V4(*a)).collect(),
        auth,
    };
    let src = f.forged_src.unwrap_or(f.src);
    let packets: Vec<(Vec<u8>, libc::sockaddr_in)> = f
        .dsts
        .iter()
        .map(|d| {
            let payload = codec::encode(&advert, src.into(), (*d).into()).expect("encodable");
            // The kernel fills in the ID and the header checksum.
            let mut bytes = vec![0x45, 0xc0];
            bytes.extend_from_slice(&(20 + payload.len() as u16).to_be_bytes());
            bytes.extend_from_slice(&[0, 0, 0, 0, f.ttl, 112, 0, 0]);
            bytes.extend_from_slice(&src.octets());
            bytes.extend_from_slice(&d.octets());
            bytes.extend_from_slice(&payload);
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(d.octets()),
                },
                sin_zero: [0; 8],
            };
            (bytes, sa)
        })
        .collect();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(f.secs);
    let mut sent = 0u64;
    while Instant::now() < end {
        for (bytes, sa) in &packets {
            // SAFETY: buffer and address valid for the call.
            let n = unsafe {
                libc::sendto(
                    s,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    0,
                    (sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                )
            };
            if n > 0 {
                sent += 1;
            }
        }
        if f.rate > 0 {
            // Pace to the rate: sleep until this many packets are due.
            let due = Duration::from_secs_f64(sent as f64 / f.rate as f64);
            let el = start.elapsed();
            if due > el {
                std::thread::sleep(due - el);
            }
        }
    }
    Ok(sent)
}

/// `labnode vrrp-send IFACE SRC DST[,DST..] VRID PRIO VIP[,VIP..]|- RATE SECS [ttl=N]
/// [from=ADDR] [V2PASS]`
pub fn from_args(a: &[String]) -> Flood {
    let mut ttl = 255;
    let mut forged_src = None;
    let mut v2_pass = None;
    for x in a.iter().skip(9) {
        if let Some(t) = x.strip_prefix("ttl=") {
            ttl = t.parse().unwrap();
        } else if let Some(f) = x.strip_prefix("from=") {
            forged_src = Some(f.parse().unwrap());
        } else {
            v2_pass = Some(x.clone());
        }
    }
    let list = |s: &str| -> Vec<Ipv4Addr> {
        if s == "-" {
            Vec::new()
        } else {
            s.split(',').map(|x| x.parse().unwrap()).collect()
        }
    };
    Flood {
        ttl,
        forged_src,
        ifname: a[1].clone(),
        src: a[2].parse().unwrap(),
        dsts: list(&a[3]),
        vrid: a[4].parse().unwrap(),
        priority: a[5].parse().unwrap(),
        vips: list(&a[6]),
        rate: a[7].parse().unwrap(),
        secs: a[8].parse().unwrap(),
        interval_cs: if v2_pass.is_some() { 100 } else { 10 },
        v2_pass,
    }
}
