//! Weighted Maglev lookup tables (Eisenbud et al., NSDI 2016), built in user space.
//!
//! Every node builds the same table from the same backend set: the permutation of a backend
//! depends only on its address (a fixed hash, not std's), and backends are taken in address order.
//! That is what lets a flow keep its backend when the VIP moves to another node.

use std::net::IpAddr;

use lb_common::NO_BACKEND;

/// One backend as the builder sees it. `id` is what ends up in the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub addr: IpAddr,
    pub weight: u32,
    pub id: u32,
}

/// A prime check good enough for table sizes (up to a few million).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3u64;
    while d * d <= n as u64 {
        if (n as u64).is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// 64-bit FNV-1a followed by a splitmix64 finaliser: stable across builds and platforms.
fn stable_hash(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn addr_bytes(addr: &IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Build a table of `size` slots (a prime). Backends with weight 0 get no slots; an empty set
/// (or all weights 0) gives a table of [`NO_BACKEND`].
pub fn build(entries: &[Entry], size: u32) -> Vec<u32> {
    assert!(
        is_prime(size),
        "Maglev table size must be prime, got {size}"
    );
    let m = size as u64;
    let mut live: Vec<&Entry> = entries.iter().filter(|e| e.weight > 0).collect();
    let mut table = vec![NO_BACKEND; size as usize];
    if live.is_empty() {
        return table;
    }
    live.sort_by(|a, b| a.addr.cmp(&b.addr).then(a.id.cmp(&b.id)));

    let perms: Vec<(u64, u64)> = live
        .iter()
        .map(|e| {
            let bytes = addr_bytes(&e.addr);
            let offset = stable_hash(&bytes, 0x6d61_676c_6576) % m;
            let skip = stable_hash(&bytes, 0x736b_6970) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let max_weight = live.iter().map(|e| e.weight as u64).max().unwrap_or(1);
    let mut next = vec![0u64; live.len()];
    let mut credit = vec![0u64; live.len()];
    let mut filled = 0u64;

    // Each round, every backend earns credit in proportion to its weight and spends one unit of
    // `max_weight` per slot it claims: slot counts end up proportional to weights.
    'fill: loop {
        for i in 0..live.len() {
            credit[i] += live[i].weight as u64;
            while credit[i] >= max_weight {
                credit[i] -= max_weight;
                let (offset, skip) = perms[i];
                let mut slot = (offset + next[i] * skip) % m;
                while table[slot as usize] != NO_BACKEND {
                    next[i] += 1;
                    slot = (offset + next[i] * skip) % m;
                }
                table[slot as usize] = live[i].id;
                next[i] += 1;
                filled += 1;
                if filled == m {
                    break 'fill;
                }
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn backends(n: u32) -> Vec<Entry> {
        (0..n)
            .map(|i| Entry {
                addr: IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8 + 1]),
                weight: 1,
                id: i,
            })
            .collect()
    }

    fn shares(table: &[u32]) -> HashMap<u32, usize> {
        let mut m = HashMap::new();
        for id in table {
            *m.entry(*id).or_default() += 1;
        }
        m
    }

    #[test]
    fn primes() {
        assert!(is_prime(65537));
        assert!(is_prime(2));
        assert!(!is_prime(65535));
        assert!(!is_prime(1));
        assert!(is_prime(655373));
    }

    #[test]
    fn every_backend_gets_its_share_within_one_percent() {
        for n in [3, 7, 10, 100] {
            let t = build(&backends(n), 65537);
            let s = shares(&t);
            assert_eq!(s.len(), n as usize, "every backend present, no empty slot");
            let ideal = 65537.0 / n as f64;
            for (id, c) in s {
                let dev = (c as f64 - ideal).abs() / ideal;
                assert!(
                    dev < 0.01,
                    "n={n} backend {id}: {c} slots, ideal {ideal:.0}"
                );
            }
        }
    }

    #[test]
    fn weights_are_honoured() {
        let mut b = backends(3);
        b[0].weight = 1;
        b[1].weight = 2;
        b[2].weight = 5;
        let s = shares(&build(&b, 65537));
        let total: u32 = b.iter().map(|e| e.weight).sum();
        for e in &b {
            let ideal = 65537.0 * e.weight as f64 / total as f64;
            let got = s[&e.id] as f64;
            assert!(
                (got - ideal).abs() / ideal < 0.01,
                "weight {}: {got} vs {ideal:.0}",
                e.weight
            );
        }
    }

    #[test]
    fn zero_weight_and_empty_sets() {
        let mut b = backends(2);
        b[1].weight = 0;
        let t = build(&b, 13);
        assert!(t.iter().all(|id| *id == 0));
        assert!(build(&[], 13).iter().all(|id| *id == NO_BACKEND));
    }

    #[test]
    fn removing_one_of_n_moves_about_one_nth() {
        for n in [5u32, 10, 50] {
            let all = backends(n);
            let before = build(&all, 65537);
            let removed = n / 2;
            let rest: Vec<Entry> = all.iter().filter(|e| e.id != removed).cloned().collect();
            let after = build(&rest, 65537);
            let moved = before
                .iter()
                .zip(&after)
                .filter(|(b, a)| *b != *a && **b != removed)
                .count();
            let had_removed = before.iter().filter(|b| **b == removed).count();
            // Slots of the removed backend must move; of the others, only a small fraction may.
            let frac_other = moved as f64 / 65537.0;
            assert!(had_removed > 0);
            assert!(
                frac_other < 1.0 / n as f64,
                "n={n}: {frac_other:.4} of slots of surviving backends moved"
            );
            let total_moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
            let ideal = 65537.0 / n as f64;
            assert!(
                (total_moved as f64) < 2.0 * ideal,
                "n={n}: {total_moved} slots moved, ideal {ideal:.0}"
            );
        }
    }

    #[test]
    fn same_input_in_any_order_gives_the_same_table() {
        let b = backends(20);
        let mut r = b.clone();
        r.reverse();
        assert_eq!(build(&b, 65537), build(&r, 65537));
    }

    #[test]
    fn ids_do_not_influence_slot_placement() {
        // Two nodes may number backends differently; the table must map slots to the same
        // addresses on both.
        let a = backends(5);
        let mut b = a.clone();
        for e in &mut b {
            e.id += 100;
        }
        let ta = build(&a, 251);
        let tb = build(&b, 251);
        assert!(ta.iter().zip(&tb).all(|(x, y)| *x + 100 == *y));
    }
}
