//! Rise/fall: turns a stream of probe results into a health state (pure, no I/O, no clock).
//!
//! # Initial state: `Unknown`, and the first result decides
//!
//! haproxy starts servers as up, which sends traffic to a dead backend for `fall` intervals
//! after every start. Starting as down and demanding `rise` successes delays traffic by
//! `rise` intervals after every start for no gain. Here a backend starts `Unknown`, which
//! gets no traffic, and its first probe result decides directly: one passed probe means it
//! answered just now, so traffic flows one probe after start (under `interval` +
//! `timeout`), and a backend is never sent traffic before it has passed a check. Rise and
//! fall apply to every change after that.
//!
//! A daemon adopting pinned state after a restart already knows which backends carried
//! traffic; it can start those trackers `Up` (and others `Down`) so a restart changes no
//! table until the checks say so.

use serde::Serialize;

/// Health of one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// No probe result yet; not to be sent traffic.
    #[default]
    Unknown,
    Up,
    Down,
}

impl Health {
    /// Whether the backend should receive new flows.
    pub fn is_up(self) -> bool {
        self == Health::Up
    }
}

/// A change of state caused by one result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: Health,
    pub to: Health,
}

/// Consecutive-result counter with rise/fall thresholds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracker {
    rise: u32,
    fall: u32,
    state: Health,
    successes: u32,
    failures: u32,
}

impl Tracker {
    /// `rise` and `fall` below 1 are taken as 1 (config validation refuses them anyway).
    pub fn new(rise: u32, fall: u32, initial: Health) -> Self {
        Self {
            rise: rise.max(1),
            fall: fall.max(1),
            state: initial,
            successes: 0,
            failures: 0,
        }
    }

    pub fn state(&self) -> Health {
        self.state
    }

    /// Consecutive passed probes up to now (0 after a failure).
    pub fn consecutive_successes(&self) -> u32 {
        self.successes
    }

    /// Consecutive failed probes up to now (0 after a success).
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// New thresholds (config reload); the state and the counts stay, so a reload alone never
    /// flips a backend, and the next result is judged by the new thresholds.
    pub fn set_thresholds(&mut self, rise: u32, fall: u32) {
        self.rise = rise.max(1);
        self.fall = fall.max(1);
    }

    /// Mark down without a failed probe (the node behind it was seen to die, e.g. its VRRP
    /// master-down timer expired): it comes back only through `rise` passing probes.
    pub fn force_down(&mut self) -> Option<Transition> {
        self.successes = 0;
        if self.state == Health::Down {
            return None;
        }
        let from = std::mem::replace(&mut self.state, Health::Down);
        Some(Transition {
            from,
            to: Health::Down,
        })
    }

    /// Record a failed probe that the backend itself refused or reset: it goes down at once,
    /// without waiting for `fall` (a dead apiserver refuses; waiting only sends it flows that
    /// fail), and comes back through `rise` as usual.
    pub fn record_hard_failure(&mut self) -> Option<Transition> {
        self.failures = self.failures.saturating_add(1);
        self.successes = 0;
        if self.state == Health::Down {
            return None;
        }
        let from = std::mem::replace(&mut self.state, Health::Down);
        Some(Transition {
            from,
            to: Health::Down,
        })
    }

    /// Record one probe result; returns the transition it caused, if any.
    pub fn record(&mut self, ok: bool) -> Option<Transition> {
        // Saturate: a backend up for years must not overflow its counter.
        if ok {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        }
        let to = match self.state {
            Health::Unknown if ok => Health::Up,
            Health::Unknown => Health::Down,
            Health::Down if self.successes >= self.rise => Health::Up,
            Health::Up if self.failures >= self.fall => Health::Down,
            s => s,
        };
        if to == self.state {
            return None;
        }
        let from = std::mem::replace(&mut self.state, to);
        Some(Transition { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed results as a string of `+` (pass) and `-` (fail); returns the state after each.
    fn run(t: &mut Tracker, results: &str) -> Vec<Health> {
        results
            .chars()
            .map(|c| {
                t.record(c == '+');
                t.state()
            })
            .collect()
    }

    use Health::{Down, Unknown, Up};

    #[test]
    fn first_result_decides() {
        let mut t = Tracker::new(3, 3, Unknown);
        assert_eq!(t.state(), Unknown);
        assert!(!t.state().is_up());
        assert_eq!(
            t.record(true),
            Some(Transition {
                from: Unknown,
                to: Up
            })
        );
        let mut t = Tracker::new(3, 3, Unknown);
        assert_eq!(
            t.record(false),
            Some(Transition {
                from: Unknown,
                to: Down
            })
        );
    }

    #[test]
    fn fall_needs_consecutive_failures() {
        let mut t = Tracker::new(2, 3, Up);
        assert_eq!(run(&mut t, "--+--"), [Up, Up, Up, Up, Up]);
        assert_eq!(t.consecutive_failures(), 2);
        assert_eq!(t.record(false).map(|x| x.to), Some(Down));
        assert_eq!(run(&mut t, "---"), [Down, Down, Down]);
    }

    #[test]
    fn rise_needs_consecutive_successes() {
        let mut t = Tracker::new(2, 3, Down);
        assert_eq!(run(&mut t, "+-+"), [Down, Down, Down]);
        assert_eq!(t.record(true).map(|x| x.to), Some(Up));
        assert_eq!(t.consecutive_successes(), 2);
        // Failures below `fall` do not take it down again.
        assert_eq!(run(&mut t, "--+"), [Up, Up, Up]);
    }

    #[test]
    fn one_means_immediate() {
        let mut t = Tracker::new(1, 1, Up);
        assert_eq!(run(&mut t, "-+-+"), [Down, Up, Down, Up]);
    }

    #[test]
    fn transitions_are_reported_once() {
        let mut t = Tracker::new(2, 2, Unknown);
        let changes: Vec<_> = "+++---+++"
            .chars()
            .filter_map(|c| t.record(c == '+'))
            .map(|x| x.to)
            .collect();
        assert_eq!(changes, [Up, Down, Up]);
    }

    #[test]
    fn zero_thresholds_act_as_one() {
        let mut t = Tracker::new(0, 0, Up);
        assert_eq!(run(&mut t, "-+"), [Down, Up]);
    }

    #[test]
    fn new_thresholds_keep_state_and_counts() {
        let mut t = Tracker::new(2, 5, Up);
        run(&mut t, "---");
        t.set_thresholds(2, 3);
        assert_eq!(t.state(), Up, "a reload alone flips nothing");
        assert_eq!(t.record(false).map(|x| x.to), Some(Down));
    }

    #[test]
    fn counters_saturate() {
        let mut t = Tracker::new(1, 1, Up);
        t.successes = u32::MAX;
        assert_eq!(t.record(true), None);
        assert_eq!(t.consecutive_successes(), u32::MAX);
    }

    #[test]
    fn a_hard_failure_takes_it_down_at_once_and_rise_brings_it_back() {
        let mut t = Tracker::new(3, 3, Up);
        assert_eq!(
            t.record_hard_failure(),
            Some(Transition { from: Up, to: Down })
        );
        assert_eq!(t.record_hard_failure(), None);
        assert_eq!(t.consecutive_failures(), 2);
        assert_eq!(run(&mut t, "++-+++"), [Down, Down, Down, Down, Down, Up]);
        let mut t = Tracker::new(3, 3, Unknown);
        assert_eq!(t.record_hard_failure().map(|x| x.to), Some(Down));
    }

    #[test]
    fn forced_down_comes_back_through_the_rise_count() {
        let mut t = Tracker::new(3, 2, Health::Up);
        assert_eq!(
            t.force_down(),
            Some(Transition {
                from: Health::Up,
                to: Health::Down
            })
        );
        assert_eq!(t.force_down(), None, "already down");
        assert_eq!(
            run(&mut t, "++-+++"),
            [
                Health::Down,
                Health::Down,
                Health::Down,
                Health::Down,
                Health::Down,
                Health::Up
            ]
        );
    }
}
