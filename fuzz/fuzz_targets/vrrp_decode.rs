//! Feeds arbitrary bytes to the VRRP decoder: it must never panic. The first byte picks the
//! address family and the pseudo-header addresses, so both the IPv4 and IPv6 checksum paths and
//! both versions (the version is in the packet) are reached.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;

// The codec is std-only and included directly, so the fuzz build does not compile the daemon
// (aya, hyper, the eBPF build) with sanitizers.
#[path = "../../lb-core/src/vrrp/codec.rs"]
#[allow(dead_code)]
mod codec;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (src, dst): (IpAddr, IpAddr) = if selector & 1 == 0 {
        let dst = if selector & 2 == 0 {
            IpAddr::V4(codec::MCAST_V4)
        } else {
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2))
        };
        (IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), dst)
    } else {
        (
            IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
            IpAddr::V6(codec::MCAST_V6),
        )
    };
    if let Ok(advert) = codec::decode(rest, src, dst) {
        // Whatever decodes must encode, and decode back to the same advert. (Not necessarily to
        // the same bytes: reserved bits and ignored v2 auth data are dropped, and a checksum of
        // 0x0000 and 0xffff both verify.)
        let again = codec::encode(&advert, src, dst).expect("decoded advert encodes");
        assert_eq!(codec::decode(&again, src, dst), Ok(advert));
    }
    // A mismatched family must be rejected, not crash.
    let _ = codec::decode(rest, src, IpAddr::V6(Ipv6Addr::LOCALHOST));
});
