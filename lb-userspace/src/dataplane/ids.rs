//! The numbers the map writer hands out, apart from the maps (pure): backend slots, VIP ids and
//! pair epochs. The data plane's hardest invariants rest on them:
//!
//! - A retired backend slot is reused only after every never-used one is gone, and then the
//!   longest-retired first: connection-table entries naming a retired slot outlive it, and the
//!   later its reuse, the fewer of them are still around (their epoch differs anyway, see
//!   `lb_common::FlowValue`).
//! - A VIP service takes the lowest free VIP id.
//! - A pair epoch is never handed out twice, across restarts too: the next one is persisted
//!   before it is used, and one that an adopted slot holds is never handed out again.

use std::collections::VecDeque;

/// Backend slots (`LB_BACKENDS` indexes) below `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendIds {
    limit: u32,
    /// Every slot below this has been handed out at some time.
    next: u32,
    /// Retired slots, the longest-retired first.
    free: VecDeque<u32>,
}

impl BackendIds {
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            next: 0,
            free: VecDeque::new(),
        }
    }

    /// The slots after adopting pinned maps: `used` are in use; below the highest of them,
    /// the others count as retired (lowest first: their age is not known).
    pub fn adopted(limit: u32, used: impl IntoIterator<Item = u32>) -> Self {
        let mut in_use = vec![false; limit as usize];
        let mut next = 0;
        for id in used {
            in_use[id as usize] = true;
            next = next.max(id + 1);
        }
        Self {
            limit,
            next,
            free: (0..next).filter(|i| !in_use[*i as usize]).collect(),
        }
    }

    /// A slot: a never-used one while any is left, else the longest-retired. `None`: all
    /// `limit` are in use.
    pub fn take(&mut self) -> Option<u32> {
        if self.next < self.limit {
            self.next += 1;
            return Some(self.next - 1);
        }
        self.free.pop_front()
    }

    /// `id` is retired: it goes to the back of the free ones.
    pub fn release(&mut self, id: u32) {
        debug_assert!(id < self.next && !self.free.contains(&id), "slot {id}");
        self.free.push_back(id);
    }
}

/// The lowest VIP id below `limit` that `used` does not hold.
pub fn lowest_free_vip_id(used: impl IntoIterator<Item = u32>, limit: u32) -> Option<u32> {
    let used: Vec<u32> = used.into_iter().collect();
    (0..limit).find(|i| !used.contains(i))
}

/// Pair epochs: never 0 (a slot never written), never one handed out before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epochs(u32);

impl Epochs {
    /// Starting from the value persisted in `LbConfig::next_epoch` (0 on fresh maps).
    pub fn from_persisted(next: u32) -> Self {
        Self(next.max(1))
    }

    /// An adopted slot holds `epoch`: it is never handed out again.
    pub fn seen(&mut self, epoch: u32) {
        self.0 = self.0.max(epoch.wrapping_add(1)).max(1);
    }

    /// The epoch to hand out and the value to persist before using it. `None`: exhausted.
    pub fn next(&self) -> Option<(u32, u32)> {
        Some((self.0, self.0.checked_add(1)?))
    }

    /// The persisted value of [`Epochs::next`] is written: move on to it.
    pub fn advance_to(&mut self, next: u32) {
        self.0 = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_used_slots_go_first_then_the_longest_retired() {
        let mut ids = BackendIds::new(4);
        assert_eq!([ids.take(), ids.take()], [Some(0), Some(1)]);
        ids.release(1);
        ids.release(0);
        // Slots 2 and 3 were never used: they go before the retired ones.
        assert_eq!([ids.take(), ids.take()], [Some(2), Some(3)]);
        // Then 1 (retired first), then 0.
        assert_eq!(
            [ids.take(), ids.take(), ids.take()],
            [Some(1), Some(0), None]
        );
        ids.release(3);
        assert_eq!(ids.take(), Some(3));
    }

    #[test]
    fn adopted_slots_stay_taken_and_the_gaps_below_them_are_free() {
        let mut ids = BackendIds::adopted(6, [4, 1]);
        // 5 was never used; then the gaps 0, 2, 3 (lowest first).
        let got: Vec<Option<u32>> = (0..5).map(|_| ids.take()).collect();
        assert_eq!(got, [Some(5), Some(0), Some(2), Some(3), None]);
        assert_eq!(BackendIds::adopted(3, []), BackendIds::new(3));
    }

    #[test]
    fn vip_ids_take_the_lowest_free_one() {
        assert_eq!(lowest_free_vip_id([0, 2], 4), Some(1));
        assert_eq!(lowest_free_vip_id([], 4), Some(0));
        assert_eq!(lowest_free_vip_id([0, 1], 2), None);
    }

    #[test]
    fn an_epoch_is_never_handed_out_twice_nor_zero() {
        let mut e = Epochs::from_persisted(0);
        assert_eq!(e.next(), Some((1, 2)));
        e.advance_to(2);
        // An adopted slot holds epoch 9: the next one is above it.
        e.seen(9);
        assert_eq!(e.next(), Some((10, 11)));
        // One held below changes nothing.
        e.seen(3);
        assert_eq!(e.next(), Some((10, 11)));
        let mut last = Epochs::from_persisted(u32::MAX);
        assert_eq!(last.next(), None);
        last.seen(u32::MAX);
        assert_eq!(last, Epochs::from_persisted(u32::MAX));
    }
}
