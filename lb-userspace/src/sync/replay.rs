//! Replay protection for sync datagrams (pure). A sender numbers its datagrams with its wall
//! clock in microseconds, kept strictly increasing, so numbers keep growing across its
//! restarts without any stored state. A receiver accepts a number once: newer than the highest
//! seen, or one of the 64 below it not seen yet (UDP reorders); and only within
//! [`FRESH_US`] of its own clock, so a datagram captured earlier cannot be replayed to a
//! receiver that restarted and forgot what it saw.

/// How far a sequence number (microseconds since the epoch) may be from the receiver's clock.
/// Nodes of a cluster run NTP; a minute leaves room for a skew that breaks nothing else.
pub const FRESH_US: u64 = 60_000_000;

/// Why a datagram's number was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Already accepted once.
    Replayed,
    /// More than 64 below the highest accepted.
    TooOld,
    /// Not within [`FRESH_US`] of this node's clock.
    Stale,
}

/// One peer's window.
#[derive(Debug, Default, Clone)]
pub struct Window {
    highest: u64,
    /// Bit i: `highest - i` was accepted.
    seen: u64,
}

impl Window {
    pub fn check(&mut self, seq: u64, now_us: u64) -> Result<(), Refusal> {
        if seq.abs_diff(now_us) > FRESH_US {
            return Err(Refusal::Stale);
        }
        if seq > self.highest {
            let shift = seq - self.highest;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.highest = seq;
            return Ok(());
        }
        let back = self.highest - seq;
        if back >= 64 {
            return Err(Refusal::TooOld);
        }
        if self.seen & (1 << back) != 0 {
            return Err(Refusal::Replayed);
        }
        self.seen |= 1 << back;
        Ok(())
    }

    pub fn highest(&self) -> u64 {
        self.highest
    }
}

/// The sender's side: the next number, at least the clock and above the last.
#[derive(Debug, Default)]
pub struct Counter {
    last: u64,
}

impl Counter {
    pub fn next(&mut self, now_us: u64) -> u64 {
        self.last = now_us.max(self.last + 1);
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000_000;

    #[test]
    fn each_number_is_accepted_once_in_any_order() {
        let mut w = Window::default();
        assert_eq!(w.check(NOW + 5, NOW), Ok(()));
        assert_eq!(w.check(NOW + 3, NOW), Ok(()));
        assert_eq!(w.check(NOW + 7, NOW), Ok(()));
        assert_eq!(w.check(NOW + 3, NOW), Err(Refusal::Replayed));
        assert_eq!(w.check(NOW + 5, NOW), Err(Refusal::Replayed));
        assert_eq!(w.check(NOW + 7, NOW), Err(Refusal::Replayed));
        assert_eq!(w.check(NOW + 6, NOW), Ok(()));
        assert_eq!(w.check(NOW + 200, NOW), Ok(()));
        assert_eq!(w.check(NOW + 100, NOW), Err(Refusal::TooOld));
        assert_eq!(w.check(NOW + 137, NOW), Ok(()));
        assert_eq!(w.check(NOW + 137, NOW), Err(Refusal::Replayed));
    }

    #[test]
    fn numbers_far_from_the_clock_are_stale() {
        let mut w = Window::default();
        assert_eq!(w.check(NOW - FRESH_US - 1, NOW), Err(Refusal::Stale));
        assert_eq!(w.check(NOW + FRESH_US + 1, NOW), Err(Refusal::Stale));
        assert_eq!(w.check(NOW - FRESH_US, NOW), Ok(()));
    }

    #[test]
    fn the_counter_grows_even_when_the_clock_does_not() {
        let mut c = Counter::default();
        let a = c.next(NOW);
        let b = c.next(NOW);
        let d = c.next(NOW - 10);
        assert!(a < b && b < d);
    }
}
