//! The sync datagram (pure): a header, fixed-size records, and an HMAC-SHA256 tag over both
//! with the cluster key. Nothing of a datagram is looked at before its tag checks out.
//!
//! ```text
//! version 2:
//! 0      4       5       6       8          16         24         28      32            40
//! | LBS1 | ver 2 | flags | count | run (u64) | echo (u64) | epoch u32 | 0 x4 | seq (u64) | records | tag (32) |
//! version 1 (read, and sent to a peer heard speaking it: a rolling upgrade):
//! | LBS1 | ver 1 | flags | count | seq (u64) | records | tag (32) |
//! record: src 16 | dst 16 | sport 2 | dport 2 | proto 1 | family 1 | backend 16 | bfamily 1 |
//!         rflags 1 | close seq 1 | close age (ms, u24) 3
//! ```
//!
//! All big-endian. `run` is the sender's identity for this run of lbd (random at its start),
//! `epoch` counts its clock's steps back since then (its sequence numbers start again from its
//! clock in a new epoch), and `echo` is the receiver's `run` as the sender last heard it (0:
//! not heard yet). Inside the tag, they key the receiver's replay window (`replay::Gate`), not
//! the UDP source address, which nothing authenticates.
//!
//! Flags: [`F_HELLO`] (the sender started lately and has nothing of its peers: send it
//! everything), [`F_RETRACT`] (the records are retractions). A receiver of another version
//! refuses a datagram with a flag it does not know.
//!
//! Record flags: [`R_CLOSED`] (the client closed the connection: the close's end bits and the
//! age of its time unit follow, see [`Close`]). These five bytes were zero before, and a
//! receiver of an earlier lbd ignores them: it installs the entry open, as it always did.
//! Other record flag bits are ignored.
//!
//! The tag itself is the caller's [`Mac`] (lbd's is HMAC-SHA256 with ring, which compares tags
//! in constant time): this crate links no crypto, and the format is tested with any MAC.

use std::net::IpAddr;

use lb_common::{FAMILY_V4, FAMILY_V6, FlowKey, PROTO_TCP, PROTO_UDP};

/// What authenticates a datagram: a [`TAG`]-byte tag over its bytes with the cluster key.
pub trait Mac {
    fn tag(&self, data: &[u8]) -> [u8; TAG];
    /// Whether `tag` is `data`'s (in constant time, for a real key).
    fn verify(&self, data: &[u8], tag: &[u8]) -> bool;
}

pub const MAGIC: [u8; 4] = *b"LBS1";
pub const VERSION: u8 = 2;
/// The first version: no run, echo or epoch (replay windows keyed on the source address).
pub const VERSION_1: u8 = 1;
pub const HEADER: usize = 40;
const HEADER_1: usize = 16;
pub const RECORD: usize = 60;
pub const TAG: usize = 32;
/// Records per datagram (either version): the whole stays under 1400 bytes (no fragments on a 1500-byte path,
/// IPv6 and UDP headers included).
pub const MAX_RECORDS: usize = 22;
pub const MAX_DATAGRAM: usize = HEADER + MAX_RECORDS * RECORD + TAG;
/// The sender just started: its peers send it all their exceptions at once.
pub const F_HELLO: u8 = 1;
/// The records are retractions: each names a connection the sender had sent as an exception
/// to that backend and now holds on its slot (the client reused the 5-tuple for a new
/// connection); a receiver drops its entry for the flow if it still names that backend.
pub const F_RETRACT: u8 = 2;

/// The record's connection was closed by its client (`FLOW_F_CLIENT_CLOSED`): [`Close`] holds
/// what the receiver's close rule needs.
pub const R_CLOSED: u8 = 1;
/// The largest close age a record carries (ms, 24 bits: past the data plane's 2,199 s wrap).
pub const MAX_CLOSE_AGE_MS: u32 = (1 << 24) - 1;

/// A closed connection's close, as its entry holds it: the low 7 bits of the closing segment's
/// end (`FlowValue::close_seq`), and the time since the start of the coarse time unit the close
/// fell in, in ms (`FlowValue::close_age_ns`), so the receiver keeps the hold rather than
/// restarting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Close {
    pub seq: u8,
    pub age_ms: u32,
}

/// One connection: its 5-tuple (as the connection table keys it), its backend's address and,
/// if its client closed it, the close.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub key: FlowKey,
    pub backend: IpAddr,
    pub close: Option<Close>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum WireError {
    /// Too short, too long, or a count that does not match the length.
    Size,
    /// The tag does not match: not from a holder of the cluster key, or altered.
    Auth,
    /// Authentic but of another version, or with flags this version does not know.
    Version,
    /// Authentic, but a record is not a TCP/UDP flow of a known family.
    Record,
}

fn addr_bytes(a: IpAddr) -> ([u8; 16], u8) {
    match a {
        IpAddr::V4(v) => {
            let mut b = [0; 16];
            b[..4].copy_from_slice(&v.octets());
            (b, FAMILY_V4)
        }
        IpAddr::V6(v) => (v.octets(), FAMILY_V6),
    }
}

fn addr_of(b: &[u8], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_V4 if b[4..16].iter().all(|x| *x == 0) => {
            Some(IpAddr::from([b[0], b[1], b[2], b[3]]))
        }
        FAMILY_V6 => Some(IpAddr::from(<[u8; 16]>::try_from(&b[..16]).ok()?)),
        _ => None,
    }
}

/// Who sent a datagram, as its tag vouches (version 2), and what it knew of the receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sender {
    /// The sender's run (random at its start; never 0).
    pub run: u64,
    /// The sender's clock epoch within its run.
    pub epoch: u32,
    /// The receiver's run as the sender knows it (0: unknown).
    pub echo: u64,
}

/// A datagram's header fields past the tag check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// `None` for a version-1 datagram (no run: its replay window is its source address's).
    pub sender: Option<Sender>,
    pub seq: u64,
    pub flags: u8,
    pub records: Vec<Record>,
}

/// One datagram of at most [`MAX_RECORDS`] records, numbered `seq`, signed with `key`:
/// version 2 with `sender`, version 1 without.
pub fn seal(
    key: &impl Mac,
    sender: Option<Sender>,
    seq: u64,
    flags: u8,
    records: &[Record],
) -> Vec<u8> {
    assert!(records.len() <= MAX_RECORDS);
    let mut out = Vec::with_capacity(HEADER + records.len() * RECORD + TAG);
    out.extend_from_slice(&MAGIC);
    out.push(if sender.is_some() { VERSION } else { VERSION_1 });
    out.push(flags);
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    if let Some(s) = sender {
        out.extend_from_slice(&s.run.to_be_bytes());
        out.extend_from_slice(&s.echo.to_be_bytes());
        out.extend_from_slice(&s.epoch.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
    }
    out.extend_from_slice(&seq.to_be_bytes());
    for r in records {
        let k = &r.key;
        out.extend_from_slice(&k.src);
        out.extend_from_slice(&k.dst);
        out.extend_from_slice(&k.sport.to_be_bytes());
        out.extend_from_slice(&k.dport.to_be_bytes());
        out.push(k.proto);
        out.push(k.family);
        let (b, f) = addr_bytes(r.backend);
        out.extend_from_slice(&b);
        out.push(f);
        match r.close {
            Some(c) => {
                out.push(R_CLOSED);
                out.push(c.seq & 0x7f);
                out.extend_from_slice(&c.age_ms.min(MAX_CLOSE_AGE_MS).to_be_bytes()[1..]);
            }
            None => out.extend_from_slice(&[0; 5]),
        }
    }
    let tag = key.tag(&out);
    out.extend_from_slice(&tag);
    out
}

/// Check a datagram's tag, then read it: its sender, number, flags and records.
pub fn open(key: &impl Mac, buf: &[u8]) -> Result<Opened, WireError> {
    if buf.len() < HEADER_1 + TAG || buf.len() > MAX_DATAGRAM {
        return Err(WireError::Size);
    }
    let (body, tag) = buf.split_at(buf.len() - TAG);
    if !key.verify(body, tag) {
        return Err(WireError::Auth);
    }
    if body[..4] != MAGIC || body[5] & !(F_HELLO | F_RETRACT) != 0 {
        return Err(WireError::Version);
    }
    let u64_at = |i: usize| u64::from_be_bytes(body[i..i + 8].try_into().unwrap());
    let (header, sender) = match body[4] {
        VERSION if body.len() >= HEADER => {
            let s = Sender {
                run: u64_at(8),
                echo: u64_at(16),
                epoch: u32::from_be_bytes(body[24..28].try_into().unwrap()),
            };
            if s.run == 0 {
                return Err(WireError::Version);
            }
            (HEADER, Some(s))
        }
        VERSION => return Err(WireError::Size),
        VERSION_1 => (HEADER_1, None),
        _ => return Err(WireError::Version),
    };
    let count = u16::from_be_bytes([body[6], body[7]]) as usize;
    if body.len() != header + count * RECORD {
        return Err(WireError::Size);
    }
    let seq = u64_at(header - 8);
    let mut out = Vec::with_capacity(count);
    for r in body[header..].chunks_exact(RECORD) {
        let family = r[37];
        let proto = r[36];
        if !(proto == PROTO_TCP || proto == PROTO_UDP) {
            return Err(WireError::Record);
        }
        let src = addr_of(&r[0..16], family).ok_or(WireError::Record)?;
        let dst = addr_of(&r[16..32], family).ok_or(WireError::Record)?;
        let backend = addr_of(&r[38..54], r[54]).ok_or(WireError::Record)?;
        let (src, _) = addr_bytes(src);
        let (dst, _) = addr_bytes(dst);
        out.push(Record {
            key: FlowKey {
                src,
                dst,
                sport: u16::from_be_bytes([r[32], r[33]]),
                dport: u16::from_be_bytes([r[34], r[35]]),
                proto,
                family,
                _pad: [0; 2],
            },
            backend,
            close: (r[55] & R_CLOSED != 0).then(|| Close {
                seq: r[56] & 0x7f,
                age_ms: u32::from_be_bytes([0, r[57], r[58], r[59]]),
            }),
        });
    }
    Ok(Opened {
        sender,
        seq,
        flags: body[5],
        records: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keyed checksum standing in for HMAC: not a MAC anyone should trust, but every byte and
    /// the key change it, which is what the format's tests need.
    struct TestKey(u8);

    impl Mac for TestKey {
        fn tag(&self, data: &[u8]) -> [u8; TAG] {
            let mut t = [self.0; TAG];
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(self.0);
            for (i, b) in data.iter().enumerate() {
                h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
                t[i % TAG] ^= (h >> 32) as u8;
            }
            t[..8].copy_from_slice(&h.to_be_bytes());
            t
        }
        fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
            self.tag(data).as_slice() == tag
        }
    }

    fn key(secret: &[u8]) -> TestKey {
        TestKey(secret[0])
    }

    fn rec(i: u8, v6: bool) -> Record {
        let (src, family) = if v6 {
            addr_bytes(format!("fd00::{i}").parse().unwrap())
        } else {
            addr_bytes(format!("10.0.0.{i}").parse().unwrap())
        };
        let (dst, _) = if v6 {
            addr_bytes("fd00::100".parse().unwrap())
        } else {
            addr_bytes("10.0.0.100".parse().unwrap())
        };
        Record {
            key: FlowKey {
                src,
                dst,
                sport: 40000 + i as u16,
                dport: 6443,
                proto: PROTO_TCP,
                family,
                _pad: [0; 2],
            },
            backend: if v6 {
                "fd00::11".parse().unwrap()
            } else {
                "10.0.0.11".parse().unwrap()
            },
            close: (i % 3 == 1).then_some(Close {
                seq: i * 5 % 128,
                age_ms: u32::from(i) * 1_000_003 % (MAX_CLOSE_AGE_MS + 1),
            }),
        }
    }

    const S: Option<Sender> = Some(Sender {
        run: 0x0102_0304_0506_0708,
        epoch: 3,
        echo: 9,
    });

    fn opened(sender: Option<Sender>, seq: u64, flags: u8, records: Vec<Record>) -> Opened {
        Opened {
            sender,
            seq,
            flags,
            records,
        }
    }

    #[test]
    fn a_sealed_datagram_opens_to_what_was_sealed() {
        let k = key(&[7; 32]);
        let recs: Vec<Record> = (0..MAX_RECORDS as u8).map(|i| rec(i, i % 2 == 0)).collect();
        let d = seal(&k, S, 42, 0, &recs);
        assert!(d.len() <= MAX_DATAGRAM && d.len() <= 1400);
        assert_eq!(open(&k, &d), Ok(opened(S, 42, 0, recs.clone())));
        assert_eq!(
            open(&k, &seal(&k, S, 1, F_HELLO, &[])),
            Ok(opened(S, 1, F_HELLO, vec![]))
        );
        let r = vec![rec(3, true)];
        assert_eq!(
            open(&k, &seal(&k, S, 2, F_HELLO | F_RETRACT, &r)),
            Ok(opened(S, 2, F_HELLO | F_RETRACT, r))
        );
        // A flag this version does not know: refused, not read as installs.
        assert_eq!(open(&k, &seal(&k, S, 1, 4, &[])), Err(WireError::Version));
        // Version 1 (an lbd not upgraded yet) still reads, without a sender.
        let d1 = seal(&k, None, 42, 0, &recs);
        assert_eq!(d1[4], VERSION_1);
        assert_eq!(d1.len(), d.len() - (HEADER - HEADER_1));
        assert_eq!(open(&k, &d1), Ok(opened(None, 42, 0, recs)));
        // A run of 0 is no sender's.
        let zero = Some(Sender::default());
        assert_eq!(
            open(&k, &seal(&k, zero, 1, 0, &[])),
            Err(WireError::Version)
        );
    }

    /// A closed record's close reads back (its age capped); the same bytes zero (as an earlier
    /// lbd sends them) read as an open record.
    #[test]
    fn a_close_travels_in_the_records_last_bytes() {
        let k = key(&[7; 32]);
        let mut r = rec(1, false);
        r.close = Some(Close {
            seq: 0x7f,
            age_ms: MAX_CLOSE_AGE_MS + 5,
        });
        let d = seal(&k, S, 1, 0, &[r]);
        let got = open(&k, &d).unwrap().records[0];
        assert_eq!(
            got.close,
            Some(Close {
                seq: 0x7f,
                age_ms: MAX_CLOSE_AGE_MS
            })
        );
        assert_eq!(got.key, r.key);
        let at = HEADER + RECORD - 5;
        assert_eq!(&d[at..at + 5], &[R_CLOSED, 0x7f, 0xff, 0xff, 0xff]);
        r.close = None;
        let d = seal(&k, S, 1, 0, &[r]);
        assert_eq!(&d[at..at + 5], &[0; 5]);
        assert_eq!(open(&k, &d).unwrap().records, vec![r]);
    }

    #[test]
    fn another_key_or_any_changed_byte_is_refused() {
        let k = key(&[7; 32]);
        let d = seal(&k, S, 42, 0, &[rec(1, false), rec(2, true)]);
        assert_eq!(open(&key(&[8; 32]), &d), Err(WireError::Auth));
        for i in 0..d.len() {
            let mut m = d.clone();
            m[i] ^= 0x01;
            assert!(open(&k, &m).is_err(), "byte {i} changed");
        }
        assert_eq!(open(&k, &d[..d.len() - 1]), Err(WireError::Auth));
        assert_eq!(open(&k, &d[..10]), Err(WireError::Size));
    }

    #[test]
    fn authentic_records_of_other_protocols_are_refused() {
        let k = key(&[7; 32]);
        let mut r = rec(1, false);
        r.key.proto = 1;
        assert_eq!(open(&k, &seal(&k, S, 1, 0, &[r])), Err(WireError::Record));
        let mut r = rec(1, false);
        r.key.src[8] = 1; // an IPv4 key with bytes past the address
        assert_eq!(open(&k, &seal(&k, S, 1, 0, &[r])), Err(WireError::Record));
    }
}
