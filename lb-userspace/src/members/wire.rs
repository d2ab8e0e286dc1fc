//! The membership announcement (pure): who the sender is in which VRRP instances, signed with
//! the cluster key (HMAC-SHA256). Nothing of a datagram is looked at before its tag checks out.
//!
//! ```text
//! 0      4       5       6       7   8                16
//! | LBM1 | ver 1 | flags | count | 0 | stamp (u64 BE) | count x 18-byte records | tag (32) |
//! record: vrid 1 | family 1 | the sender's source address of that instance 16
//! ```
//!
//! `stamp` is the sender's wall clock in microseconds, strictly increasing (the receiver's
//! replay window is the sync's, [`crate::sync::replay`]).

use std::net::IpAddr;

use lb_common::{FAMILY_V4, FAMILY_V6};
use ring::hmac;

pub const MAGIC: [u8; 4] = *b"LBM1";
pub const VERSION: u8 = 1;
const HEADER: usize = 16;
const RECORD: usize = 18;
const TAG: usize = 32;
/// Instances per announcement: far more than a node runs (API and ingress, two families).
pub const MAX_INSTANCES: usize = 32;
pub const MAX_DATAGRAM: usize = HEADER + MAX_INSTANCES * RECORD + TAG;

/// The sender runs the connection sync: a node sharing a VRID with it takes it as a sync peer.
pub const F_SYNC: u8 = 1;
/// The sender is stopping: it is no longer a peer.
pub const F_LEAVING: u8 = 2;
/// The sender started lately: answer at once (it waits for its peers before electing).
pub const F_HELLO: u8 = 4;
const KNOWN: u8 = F_SYNC | F_LEAVING | F_HELLO;

/// One VRRP instance of the sender: its VRID and its source address (`unicast_src`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instance {
    pub vrid: u8,
    pub addr: IpAddr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    pub stamp: u64,
    pub flags: u8,
    pub instances: Vec<Instance>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum WireError {
    Size,
    /// Not signed with an accepted key, or altered.
    Auth,
    /// Authentic but of another version or with unknown flags or families.
    Version,
}

pub fn key(secret: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret)
}

/// The datagram of `a` (at most [`MAX_INSTANCES`] instances; more are left out).
pub fn seal(key: &hmac::Key, a: &Announcement) -> Vec<u8> {
    let n = a.instances.len().min(MAX_INSTANCES);
    let mut d = Vec::with_capacity(HEADER + n * RECORD + TAG);
    d.extend_from_slice(&MAGIC);
    d.push(VERSION);
    d.push(a.flags);
    d.push(n as u8);
    d.push(0);
    d.extend_from_slice(&a.stamp.to_be_bytes());
    for i in &a.instances[..n] {
        d.push(i.vrid);
        match i.addr {
            IpAddr::V4(v) => {
                d.push(FAMILY_V4);
                d.extend_from_slice(&v.octets());
                d.extend_from_slice(&[0; 12]);
            }
            IpAddr::V6(v) => {
                d.push(FAMILY_V6);
                d.extend_from_slice(&v.octets());
            }
        }
    }
    let tag = hmac::sign(key, &d);
    d.extend_from_slice(tag.as_ref());
    d
}

/// Check `d`'s tag with each of `keys` (constant-time compare) and read it.
pub fn open(keys: &[hmac::Key], d: &[u8]) -> Result<Announcement, WireError> {
    if d.len() < HEADER + TAG || d.len() > MAX_DATAGRAM {
        return Err(WireError::Size);
    }
    let (body, tag) = d.split_at(d.len() - TAG);
    if !keys.iter().any(|k| hmac::verify(k, body, tag).is_ok()) {
        return Err(WireError::Auth);
    }
    if body[..4] != MAGIC || body[4] != VERSION || body[5] & !KNOWN != 0 {
        return Err(WireError::Version);
    }
    let n = body[6] as usize;
    if body.len() != HEADER + n * RECORD {
        return Err(WireError::Size);
    }
    let stamp = u64::from_be_bytes(body[8..16].try_into().unwrap());
    let mut instances = Vec::with_capacity(n);
    for r in body[HEADER..].chunks_exact(RECORD) {
        let addr = match r[1] {
            FAMILY_V4 if r[6..18].iter().all(|b| *b == 0) => IpAddr::from([r[2], r[3], r[4], r[5]]),
            FAMILY_V6 => IpAddr::from(<[u8; 16]>::try_from(&r[2..18]).unwrap()),
            _ => return Err(WireError::Version),
        };
        instances.push(Instance { vrid: r[0], addr });
    }
    Ok(Announcement {
        stamp,
        flags: body[5],
        instances,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a() -> Announcement {
        Announcement {
            stamp: 1_800_000_000_000_000,
            flags: F_SYNC | F_HELLO,
            instances: vec![
                Instance {
                    vrid: 14,
                    addr: "10.0.0.14".parse().unwrap(),
                },
                Instance {
                    vrid: 93,
                    addr: "fd00::14".parse().unwrap(),
                },
            ],
        }
    }

    #[test]
    fn an_announcement_opens_with_any_accepted_key_and_no_other() {
        let (k1, k2, k3) = (key(&[1; 32]), key(&[2; 32]), key(&[3; 32]));
        let d = seal(&k1, &a());
        assert_eq!(open(&[k2.clone(), k1.clone()], &d).unwrap(), a());
        assert_eq!(open(&[k2, k3], &d), Err(WireError::Auth));
        // Any byte changed: refused.
        for i in 0..d.len() {
            let mut x = d.clone();
            x[i] ^= 1;
            assert!(open(std::slice::from_ref(&k1), &x).is_err(), "byte {i}");
        }
        assert_eq!(
            open(std::slice::from_ref(&k1), &d[..10]),
            Err(WireError::Size)
        );
        // An unknown flag, even signed, is refused.
        let mut b = a();
        b.flags = 0x80;
        assert_eq!(
            open(std::slice::from_ref(&k1), &seal(&k1, &b)),
            Err(WireError::Version)
        );
    }
}
