//! The VRIDs OpenShift's on-prem platforms give a cluster's API and ingress VIPs.
//!
//! openshift/baremetal-runtimecfg (`runtimecfg vr-ids <name>`, `Cluster.PopulateVRIDs`) takes a
//! Fletcher-style 8-bit checksum of `<name>-api` and `<name>-ingress` with both running sums
//! reduced modulo 15, packs them as `(sum2 << 4) | sum1`, and adds one because VRID 0 is invalid.
//! If ingress lands on the API's VRID it is bumped by one. Only 15 x 15 = 225 values are
//! possible, which is why clusters sharing a segment collide; `lbctl vr-ids` prints these so an
//! operator can see a clash before it happens. Written from the algorithm's description; the
//! arithmetic below reproduces Go's `uint8` wrap-around because the reference is Go.

/// The checksum over raw bytes. Sums are `u8` and wrap before the modulo, as in the reference
/// implementation (this only matters for bytes >= 0xf2, i.e. some non-ASCII names).
pub fn fletcher8(input: &[u8]) -> u8 {
    let (mut a, mut b) = (0u8, 0u8);
    for &byte in input {
        a = a.wrapping_add(byte) % 15;
        b = b.wrapping_add(a) % 15;
    }
    (b << 4) | a
}

/// `(api_vrid, ingress_vrid)` for an OpenShift cluster name (the name, not the base domain).
pub fn openshift_vrids(cluster_name: &str) -> (u8, u8) {
    // The checksum is at most 0xEE, so adding one never overflows and never yields 0.
    let api = fletcher8(format!("{cluster_name}-api").as_bytes()) + 1;
    let mut ingress = fletcher8(format!("{cluster_name}-ingress").as_bytes()) + 1;
    if ingress == api {
        // Unreachable in practice (the two suffixes never map one state to the same value),
        // kept so we follow the reference exactly.
        ingress = ingress.wrapping_add(1);
    }
    (api, ingress)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values computed independently (a short Python transcription of the published
    // algorithm, with explicit 8-bit wrap), not with this code.
    #[test]
    fn known_cluster_names() {
        assert_eq!(openshift_vrids("ostest"), (14, 93));
        assert_eq!(openshift_vrids("test"), (13, 28));
        assert_eq!(openshift_vrids("ocp"), (23, 134));
        assert_eq!(openshift_vrids("mycluster"), (74, 137));
        assert_eq!(openshift_vrids("prod"), (2, 33));
        assert_eq!(openshift_vrids("lab"), (51, 146));
        assert_eq!(openshift_vrids("a"), (167, 38));
    }

    #[test]
    fn go_uint8_wraparound() {
        // "aa" then U+100000 (f4 80 80 80): 14 + 0xf4 overflows a u8. Without the wrap the API
        // VRID would be 236.
        assert_eq!(openshift_vrids("aa\u{100000}").0, 107);
    }

    #[test]
    fn range_and_distinct() {
        for name in ["", "x", "cluster-1", "a-very-long-cluster-name-0123456789"] {
            let (api, ingress) = openshift_vrids(name);
            assert!((1..=239).contains(&api), "{name}: {api}");
            assert!(ingress >= 1, "{name}");
            assert_ne!(api, ingress, "{name}");
        }
        assert_eq!(fletcher8(b""), 0);
    }
}
