//! The sync datagram: its format is `lb_core::sync::wire`'s; the tag here is HMAC-SHA256 with
//! the cluster key (ring, already linked for TLS through rustls; it compares tags in constant
//! time).

pub use lb_core::sync::wire::*;
use ring::hmac;

/// The cluster key as the datagrams' [`Mac`].
#[derive(Clone)]
pub struct HmacKey(hmac::Key);

/// The key for `secret` (a key file's bytes).
pub fn key(secret: &[u8]) -> HmacKey {
    HmacKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
}

impl Mac for HmacKey {
    fn tag(&self, data: &[u8]) -> [u8; TAG] {
        let mut t = [0; TAG];
        t.copy_from_slice(hmac::sign(&self.0, data).as_ref());
        t
    }

    fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        hmac::verify(&self.0, data, tag).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_tags_check_with_the_same_key_only() {
        let d = seal(&key(&[7; 32]), None, 1, F_HELLO, &[]);
        assert!(open(&key(&[7; 32]), &d).is_ok());
        assert_eq!(open(&key(&[8; 32]), &d), Err(WireError::Auth));
        let mut m = d.clone();
        let last = m.len() - 1;
        m[last] ^= 1;
        assert_eq!(open(&key(&[7; 32]), &m), Err(WireError::Auth));
        // HMAC-SHA256 (RFC 4231 test case 2), so a peer's tag is what any implementation makes.
        let k = HmacKey(hmac::Key::new(hmac::HMAC_SHA256, b"Jefe"));
        let t = k.tag(b"what do ya want for nothing?");
        assert_eq!(t[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    }
}
