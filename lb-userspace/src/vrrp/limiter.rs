//! Bounded logging for what peers send (pure): at most one WARN per (peer, reason) per
//! interval, however fast the packets come. Counters elsewhere count every packet; this only
//! decides which ones are worth a log line, and how many were left out since the last one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use super::state::Time;

/// One WARN per peer and reason per this interval.
pub const WARN_INTERVAL: Duration = Duration::from_secs(60);
/// Distinct (peer, reason) keys remembered; beyond that (e.g. spoofed sources) all unknown
/// peers share one key per reason, so memory stays bounded too.
pub const MAX_KEYS: usize = 256;

#[derive(Clone, Debug)]
struct Entry {
    last_logged: Time,
    suppressed: u64,
}

#[derive(Clone, Debug)]
pub struct WarnLimiter {
    interval: Duration,
    keys: HashMap<(Option<IpAddr>, &'static str), Entry>,
}

impl Default for WarnLimiter {
    fn default() -> Self {
        WarnLimiter::new(WARN_INTERVAL)
    }
}

impl WarnLimiter {
    pub fn new(interval: Duration) -> Self {
        WarnLimiter {
            interval,
            keys: HashMap::new(),
        }
    }

    /// Whether to log this event now; `Some(n)`: log it, mentioning `n` events of the same key
    /// that were not logged since the last line.
    pub fn allow(&mut self, now: Time, peer: Option<IpAddr>, reason: &'static str) -> Option<u64> {
        let mut key = (peer, reason);
        if !self.keys.contains_key(&key) && self.keys.len() >= MAX_KEYS {
            let interval = self.interval;
            self.keys
                .retain(|_, e| now < e.last_logged + interval || e.suppressed > 0);
            if self.keys.len() >= MAX_KEYS {
                key = (None, reason);
            }
        }
        match self.keys.get_mut(&key) {
            Some(e) if now < e.last_logged + self.interval => {
                e.suppressed += 1;
                None
            }
            Some(e) => {
                let n = std::mem::take(&mut e.suppressed);
                e.last_logged = now;
                Some(n)
            }
            None => {
                self.keys.insert(
                    key,
                    Entry {
                        last_logged: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn ip(i: u32) -> Option<IpAddr> {
        Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
    }

    #[test]
    fn one_line_per_peer_and_reason_per_interval() {
        let mut l = WarnLimiter::new(S(60));
        let mut lines = 0;
        // 10 000 packets per second for two minutes from one peer, one reason.
        for ms in (0..120_000u64).step_by(1).map(Duration::from_millis) {
            for _ in 0..10 {
                if l.allow(ms, ip(1), "not_a_peer").is_some() {
                    lines += 1;
                }
            }
        }
        assert_eq!(lines, 2, "one at 0 s, one at 60 s");
        // Another reason or another peer is its own key.
        assert_eq!(l.allow(S(1), ip(1), "other_vips"), Some(0));
        assert_eq!(l.allow(S(1), ip(2), "not_a_peer"), Some(0));
        // The next line says how many were left out.
        let n = l.allow(S(120), ip(1), "not_a_peer").unwrap();
        assert_eq!(n, 600_000 - 1);
    }

    #[test]
    fn spoofed_sources_share_a_key_beyond_the_bound() {
        let mut l = WarnLimiter::new(S(60));
        let mut lines = 0;
        for i in 0..100_000 {
            if l.allow(S(1), ip(i), "other_vips").is_some() {
                lines += 1;
            }
        }
        assert!(l.len() <= MAX_KEYS + 1, "{} keys", l.len());
        assert_eq!(
            lines,
            MAX_KEYS + 1,
            "distinct peers up to the bound, then one shared key"
        );
    }
}
