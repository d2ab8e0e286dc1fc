//! Graceful handover: when this node stops being a VIP's VRRP master while it stays alive (lbd
//! stopping on SIGTERM, a tracked check failing, preemption by a higher priority), clients keep
//! sending to it until their ARP/ND caches take the new owner's announcement. Passing those
//! packets to the local stack would reset their connections; forwarding them with the last table
//! for a grace period keeps them. The new owner's loop guard (`LB_PEERS`) makes that safe: a frame
//! we forward during the grace reaches a backend, never a second forwarder.
//!
//! Pure: a function of (VRRP mastership, time). The daemon asks it what the data plane should do
//! and when to ask again. A restarted lbd that adopted a forwarding data plane holds it for
//! [`adopted_hold`].

use std::time::{Duration, Instant};

/// The default grace: longer than a GARP/unsolicited-NA burst takes to land (lbd sends its
/// announcements at once and repeats them within a second).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);

/// What the data plane should do for one VRRP instance's VIPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forwarding {
    /// Forward VIP packets (as the owner does).
    pub forward: bool,
    /// In the grace period: ask again at this time (it ends then unless mastership returns).
    pub until: Option<Instant>,
}

/// The handover state of one VRRP instance.
#[derive(Clone, Debug)]
pub struct Handover {
    grace: Duration,
    master: bool,
    /// End of the current grace, while one lasts.
    grace_until: Option<Instant>,
}

impl Handover {
    pub fn new(grace: Duration) -> Self {
        Handover {
            grace,
            master: false,
            grace_until: None,
        }
    }

    /// A restarted lbd that adopted a data plane the previous lbd was forwarding for this
    /// instance (a crash and a quick restart): clients may still send here until another node
    /// has taken over and announced itself, so forward until `hold` has passed unless VRRP makes
    /// us master first. Later losses of mastership get the normal grace.
    pub fn adopted(grace: Duration, hold: Duration, now: Instant) -> Self {
        Handover {
            grace,
            master: false,
            grace_until: (!hold.is_zero()).then(|| now + hold),
        }
    }

    /// VRRP says `master` at `now` (a change or not).
    pub fn observe(&mut self, master: bool, now: Instant) -> Forwarding {
        if master {
            self.grace_until = None;
        } else if self.master && !self.grace.is_zero() {
            self.grace_until = Some(now + self.grace);
        }
        self.master = master;
        self.at(now)
    }

    /// What to do at `now` (call at `Forwarding::until`).
    pub fn at(&mut self, now: Instant) -> Forwarding {
        if self.master {
            return Forwarding {
                forward: true,
                until: None,
            };
        }
        match self.grace_until {
            Some(t) if now < t => Forwarding {
                forward: true,
                until: Some(t),
            },
            _ => {
                self.grace_until = None;
                Forwarding {
                    forward: false,
                    until: None,
                }
            }
        }
    }

    /// Time left in the grace at `now` (zero when not in one): how long a stopping lbd stays.
    pub fn remaining(&self, now: Instant) -> Duration {
        match self.grace_until {
            Some(t) if !self.master => t.saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }
}

/// How long a restarted lbd keeps forwarding with the data plane it adopted for an instance it
/// was master of (see [`Handover::adopted`]): after a crash and a quick restart, clients may
/// still send to this node (their ARP/ND caches) until another node has taken over and
/// announced it; so forward with the adopted table until the new master can have done so,
/// instead of answering from the local stack with resets: the instance's master-down interval
/// (`priority`, advert `interval`) plus a second.
pub fn adopted_hold(priority: u8, interval: Duration) -> Duration {
    crate::vrrp::state::master_down_interval(priority, interval) + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Duration = Duration::from_secs(2);

    #[test]
    fn a_backup_that_never_was_master_does_not_forward() {
        let mut h = Handover::new(G);
        let t = Instant::now();
        assert_eq!(
            h.observe(false, t),
            Forwarding {
                forward: false,
                until: None
            }
        );
        assert_eq!(h.remaining(t), Duration::ZERO);
    }

    #[test]
    fn losing_mastership_forwards_for_the_grace_then_stops() {
        let mut h = Handover::new(G);
        let t = Instant::now();
        assert!(h.observe(true, t).forward);
        let lost = t + Duration::from_secs(10);
        let f = h.observe(false, lost);
        assert_eq!(
            f,
            Forwarding {
                forward: true,
                until: Some(lost + G)
            }
        );
        assert_eq!(
            h.remaining(lost + Duration::from_millis(500)),
            G - Duration::from_millis(500)
        );
        assert!(h.at(lost + G - Duration::from_millis(1)).forward);
        assert_eq!(
            h.at(lost + G),
            Forwarding {
                forward: false,
                until: None
            }
        );
        // A repeated "backup" after the grace does not start another one.
        assert!(!h.observe(false, lost + G * 2).forward);
    }

    #[test]
    fn regaining_mastership_in_the_grace_ends_it() {
        let mut h = Handover::new(G);
        let t = Instant::now();
        h.observe(true, t);
        h.observe(false, t + Duration::from_secs(1));
        assert_eq!(
            h.observe(true, t + Duration::from_secs(2)),
            Forwarding {
                forward: true,
                until: None
            }
        );
        // Lost again later: a fresh grace from then.
        let again = t + Duration::from_secs(5);
        assert_eq!(h.observe(false, again).until, Some(again + G));
    }

    #[test]
    fn a_zero_grace_stops_at_once() {
        let mut h = Handover::new(Duration::ZERO);
        let t = Instant::now();
        h.observe(true, t);
        assert!(!h.observe(false, t).forward);
    }

    #[test]
    fn an_adopted_hold_is_the_master_down_interval_and_a_second() {
        // Priority 100, 1 s adverts: 3 intervals and a skew of (256 - 100) / 256 s.
        let hold = adopted_hold(100, Duration::from_secs(1));
        assert_eq!(
            hold,
            Duration::from_millis(4000) + Duration::from_secs(156) / 256
        );
        // Faster adverts, a shorter hold; never shorter than the second.
        assert!(adopted_hold(100, Duration::from_millis(100)) < hold);
        assert!(adopted_hold(255, Duration::ZERO) >= Duration::from_secs(1));
    }

    #[test]
    fn an_adopted_forwarding_plane_is_held_until_the_vip_has_moved() {
        let t = Instant::now();
        let hold = Duration::from_millis(1400);
        let mut h = Handover::adopted(G, hold, t);
        // VRRP starts as backup: keep forwarding with the adopted table for the hold.
        assert_eq!(
            h.observe(false, t),
            Forwarding {
                forward: true,
                until: Some(t + hold)
            }
        );
        assert!(!h.at(t + hold).forward);
        // Nothing adopted: no hold.
        let mut fresh = Handover::adopted(G, Duration::ZERO, t);
        assert!(!fresh.observe(false, t).forward);
        // Master during the hold ends it; a later loss gets the normal grace.
        let mut h = Handover::adopted(G, hold, t);
        assert!(h.observe(true, t + Duration::from_millis(10)).forward);
        let lost = t + Duration::from_secs(9);
        assert_eq!(h.observe(false, lost).until, Some(lost + G));
    }
}
