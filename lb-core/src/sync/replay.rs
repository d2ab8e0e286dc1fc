//! Replay protection for sync datagrams (pure). A sender numbers its datagrams with its wall
//! clock in microseconds, kept strictly increasing within an epoch. A receiver accepts a number
//! once: newer than the highest seen, or one of the 64 below it not seen yet (UDP reorders);
//! and only within [`FRESH_US`] of its own clock.
//!
//! The window is keyed on what the tag vouches for (`wire::Sender`): the sender's run (random
//! at its start) and clock epoch, never on the UDP source address. So a datagram of A replayed
//! with B's source lands in A's window (already seen); a node's own datagrams reflected back to
//! it are refused (its own run); and a sender whose clock steps back starts a new epoch with
//! numbers from its clock again instead of staying in the future ([`Counter`]). Records are
//! taken only from a datagram that echoes this node's run: one captured before this node
//! (re)started echoes an older run, and a restarted receiver cannot be fed the last minute's
//! captures ([`Gate::check`]).

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
    /// This node's own datagram, sent back to it.
    Reflected,
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

/// A clock step back larger than this starts a new epoch (numbers handed out in a burst run
/// ahead of the clock by a microsecond each, far less than this).
pub const STEP_BACK_US: u64 = 1_000_000;

/// The sender's side: the next number, at least the clock and above the last, within the
/// current epoch. When the clock has gone back more than [`STEP_BACK_US`] below the last number
/// (NTP stepping a clock that was ahead), a new epoch starts at the clock: receivers key their
/// window on the epoch, so the new numbers are not refused as old, nor as stale.
#[derive(Debug, Default)]
pub struct Counter {
    last: u64,
    epoch: u32,
    /// The last step back: its size in microseconds and the clock after it.
    pub stepped_back: Option<(u64, u64)>,
}

impl Counter {
    /// The epoch and the number of the next datagram.
    pub fn next(&mut self, now_us: u64) -> (u32, u64) {
        if self.last > now_us.saturating_add(STEP_BACK_US) {
            self.stepped_back = Some((self.last - now_us, now_us));
            self.epoch = self.epoch.wrapping_add(1);
            self.last = 0;
        }
        self.last = now_us.max(self.last + 1);
        (self.epoch, self.last)
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The next number without epochs (the membership announcements' stamps): at least the
    /// clock and above the last, whatever the clock does.
    pub fn next_stamp(&mut self, now_us: u64) -> u64 {
        self.last = now_us.max(self.last + 1);
        self.last
    }
}

/// What [`Gate::check`] lets through.
#[derive(Debug, PartialEq, Eq)]
pub enum Pass {
    /// New, fresh, and echoing this node's run: its records apply.
    All,
    /// New and fresh, but from before the sender heard this node's current run: its hello
    /// flag and the sender's run count (the sender learns this node's run from this node's
    /// next datagram), its records do not.
    Header,
}

/// The receiver's side: one window per sender run and epoch.
#[derive(Debug)]
pub struct Gate {
    /// This node's run (what `echo` must name).
    run: u64,
    windows: std::collections::HashMap<(u64, u32), Window>,
}

impl Gate {
    pub fn new(run: u64) -> Gate {
        Gate {
            run,
            windows: Default::default(),
        }
    }

    pub fn check(
        &mut self,
        s: &crate::sync::wire::Sender,
        seq: u64,
        now_us: u64,
    ) -> Result<Pass, Refusal> {
        if s.run == self.run {
            return Err(Refusal::Reflected);
        }
        // A window whose highest number is older than any fresh one can be forgotten: every
        // number it could still refuse is refused as stale anyway.
        self.windows
            .retain(|_, w| w.highest().saturating_add(FRESH_US) >= now_us);
        self.windows
            .entry((s.run, s.epoch))
            .or_default()
            .check(seq, now_us)?;
        Ok(if s.echo == self.run {
            Pass::All
        } else {
            Pass::Header
        })
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
        assert_eq!((a.0, b.0, d.0), (0, 0, 0));
        assert_eq!(c.stepped_back, None);
    }

    use super::super::wire::Sender;
    const A: Sender = Sender {
        run: 0xa,
        epoch: 0,
        echo: 0xc,
    };
    const B: Sender = Sender {
        run: 0xb,
        epoch: 0,
        echo: 0xc,
    };

    #[test]
    fn a_datagram_replayed_with_another_peers_source_is_refused() {
        // The window is A's wherever the datagram comes from: C saw A's datagram, and the same
        // bytes sent again "from B" are a replay. (Keyed on the source address, they were
        // accepted once more in B's window.)
        let mut c = Gate::new(0xc);
        assert_eq!(c.check(&A, NOW, NOW), Ok(Pass::All));
        assert_eq!(c.check(&B, NOW - 500, NOW), Ok(Pass::All));
        assert_eq!(c.check(&A, NOW, NOW), Err(Refusal::Replayed));
    }

    #[test]
    fn a_nodes_own_datagrams_reflected_to_it_are_refused_and_move_no_window() {
        // A's datagrams sent back to A "from B": refused as A's own, and B's window is not
        // moved onto A's clock, so B's own datagrams still pass.
        let mut a = Gate::new(0xa);
        let b_to_a = Sender { echo: 0xa, ..B };
        let ahead = NOW + 1_000;
        assert_eq!(
            a.check(&Sender { echo: 0xb, ..A }, ahead, NOW),
            Err(Refusal::Reflected)
        );
        assert_eq!(a.check(&b_to_a, NOW, NOW), Ok(Pass::All));
        assert_eq!(a.check(&b_to_a, NOW + 1, NOW), Ok(Pass::All));
    }

    #[test]
    fn a_restarted_receiver_takes_no_records_from_datagrams_captured_before() {
        // C ran as run 0xc and restarted as 0xd: A's datagrams captured before echo 0xc. Fresh
        // and never seen by the new run, their header passes (a hello still asks for a full
        // send) but their records do not. A's datagrams after it heard 0xd carry them.
        let mut c = Gate::new(0xd);
        assert_eq!(c.check(&A, NOW - 30_000_000, NOW), Ok(Pass::Header));
        assert_eq!(c.check(&A, NOW - 29_000_000, NOW), Ok(Pass::Header));
        let heard = Sender { echo: 0xd, ..A };
        assert_eq!(c.check(&heard, NOW, NOW), Ok(Pass::All));
    }

    #[test]
    fn a_clock_stepped_back_starts_a_new_epoch_that_receivers_accept() {
        // A's clock ran 10 minutes ahead, then NTP stepped it back.
        let ahead = NOW + 600_000_000;
        let mut counter = Counter::default();
        let (e0, s0) = counter.next(ahead);
        let (e1, s1) = counter.next(NOW);
        assert_eq!((e0, s0), (0, ahead));
        assert_eq!(
            (e1, s1),
            (1, NOW),
            "numbers start from the clock in a new epoch"
        );
        assert_eq!(counter.stepped_back, Some((600_000_000, NOW)));
        // A receiver whose clock is right refused the numbers from the future, and takes the
        // new epoch's at once (before, the numbers stayed in the future for ten minutes).
        let mut c = Gate::new(0xc);
        assert_eq!(c.check(&A, s0, NOW), Err(Refusal::Stale));
        assert_eq!(c.check(&Sender { epoch: e1, ..A }, s1, NOW), Ok(Pass::All));
        // A small step (a burst ahead of the clock) stays in its epoch.
        let (e2, _) = counter.next(NOW - 100);
        assert_eq!(e2, 1);
        // Windows of runs not heard for longer than any fresh number are forgotten.
        c.check(&B, NOW + 2 * FRESH_US, NOW + 2 * FRESH_US).unwrap();
        assert_eq!(c.windows.len(), 1);
    }
}
