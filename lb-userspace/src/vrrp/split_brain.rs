//! Dual-master episodes (pure): split brain is two masters at once for longer than an
//! election takes, not the single overlapping advert of an ordinary preemption.
//!
//! While we are master, every admitted advert from another router that claims one of our VIPs
//! with a priority above 0 is observed here, and those of our checked unicast peers that were
//! dropped for another version, password or interval (a migration half done); never a
//! stranger's (see [`super::admission::Policy::split_brain_evidence`]). In a preemption the loser
//! sends at most one more advert before it hears the winner, so one advert is not an episode.
//! An episode begins when the same peer is still claiming mastership at least
//! [`PERSIST`] of its advert interval after its first conflicting advert, and ends when it has
//! been silent for a master-down interval or we stop being master. Each episode counts once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use super::state::{Time, master_down_interval};

/// An episode needs conflicting adverts spanning this fraction of the peer's interval
/// (nine tenths: a steady sender's next advert, allowing for timer jitter).
pub const PERSIST: (u32, u32) = (9, 10);
/// Peers tracked at once; a flood of spoofed sources shares the oldest slot.
const MAX_PEERS: usize = 16;

#[derive(Clone, Copy, Debug)]
struct Run {
    first: Time,
    last: Time,
    interval: Duration,
    counted: bool,
}

#[derive(Clone, Debug, Default)]
pub struct DualMaster {
    runs: HashMap<IpAddr, Run>,
}

impl DualMaster {
    /// We are not master (any more): no episode can be going on.
    pub fn reset(&mut self) {
        self.runs.clear();
    }

    /// `peer` claimed mastership of our VIPs at `now` with interval `interval` while we are
    /// master. True when this starts a new episode.
    pub fn observe(&mut self, now: Time, peer: IpAddr, interval: Duration) -> bool {
        let interval = interval.max(Duration::from_millis(10));
        let expired = |r: &Run| now > r.last + master_down_interval(1, r.interval);
        if self.runs.len() >= MAX_PEERS && !self.runs.contains_key(&peer) {
            self.runs.retain(|_, r| !expired(r));
            if self.runs.len() >= MAX_PEERS
                && let Some(oldest) = self
                    .runs
                    .iter()
                    .min_by_key(|(_, r)| r.last)
                    .map(|(a, _)| *a)
            {
                self.runs.remove(&oldest);
            }
        }
        let run = self.runs.entry(peer).or_insert(Run {
            first: now,
            last: now,
            interval,
            counted: false,
        });
        if expired(run) {
            *run = Run {
                first: now,
                last: now,
                interval,
                counted: false,
            };
        }
        run.last = now;
        run.interval = interval;
        let persisted = now >= run.first + interval * PERSIST.0 / PERSIST.1;
        if persisted && !run.counted {
            run.counted = true;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_preemption_is_not_an_episode() {
        // We just preempted: the old master's one advert in flight arrives, then it steps down.
        let mut d = DualMaster::default();
        assert!(!d.observe(MS(1000), ip("10.0.0.12"), MS(100)));
        // Even two adverts close together (one answered at once) are not an episode.
        assert!(!d.observe(MS(1003), ip("10.0.0.12"), MS(100)));
        // Much later the same peer preempts... no: it becomes master again after a failover
        // of ours; a fresh single advert is again not an episode.
        assert!(!d.observe(MS(60_000), ip("10.0.0.12"), MS(100)));
    }

    #[test]
    fn a_persistent_second_master_is_one_episode() {
        let mut d = DualMaster::default();
        let peer = ip("10.0.0.12");
        let mut episodes = 0;
        // A v2 keepalived master at 1 s that cannot hear our v3 adverts, for a minute.
        for s in 0..60u64 {
            episodes += u32::from(d.observe(MS(s * 1000), peer, MS(1000)));
        }
        assert_eq!(episodes, 1);
        // It goes quiet (longer than a master-down interval), then claims again: a new one.
        assert!(!d.observe(MS(70_000), peer, MS(1000)));
        assert!(d.observe(MS(71_000), peer, MS(1000)));
        // Leaving master ends it.
        d.reset();
        assert!(!d.observe(MS(72_000), peer, MS(1000)));
    }

    #[test]
    fn a_flood_of_sources_stays_bounded() {
        let mut d = DualMaster::default();
        for i in 0..10_000u32 {
            d.observe(
                MS(u64::from(i)),
                IpAddr::from(std::net::Ipv4Addr::from(i)),
                MS(100),
            );
        }
        assert!(d.runs.len() <= MAX_PEERS);
    }
}
