//! Tracked checks and an instance's priority, with keepalived's rules (pure), so a migrated
//! `track_script { chk weight -20 }` behaves as it did under keepalived:
//!
//! - a positive weight is added while its check passes;
//! - a negative weight is added (the priority drops) while its check fails;
//! - weight 0 puts the instance in FAULT while its check fails (a master resigns).

use serde::Serialize;

/// What the tracked checks of one instance add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tracking {
    /// Added to the base priority (see [`super::state::effective_priority`]).
    pub weight: i32,
    /// A weight-0 check fails: the instance is in FAULT.
    pub fault: bool,
}

/// Combine `(weight, passing)` of every check tracked by one instance.
pub fn tracking(checks: impl IntoIterator<Item = (i32, bool)>) -> Tracking {
    let mut t = Tracking::default();
    for (weight, passing) in checks {
        match weight.signum() {
            1 if passing => t.weight += weight,
            -1 if !passing => t.weight += weight,
            0 if !passing => t.fault = true,
            _ => {}
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_weights_count_while_passing() {
        assert_eq!(tracking([(20, true), (5, true)]).weight, 25);
        assert_eq!(tracking([(20, true), (5, false)]).weight, 20);
        assert_eq!(tracking([(20, false)]), Tracking::default());
    }

    #[test]
    fn negative_weights_count_while_failing() {
        // keepalived's `weight -20`: nothing while the script succeeds, -20 while it fails.
        assert_eq!(tracking([(-20, true)]), Tracking::default());
        assert_eq!(tracking([(-20, false)]).weight, -20);
        assert_eq!(tracking([(-20, false), (10, true)]).weight, -10);
        assert_eq!(tracking([(-20, false), (-5, false)]).weight, -25);
    }

    #[test]
    fn weight_zero_means_fault_while_failing() {
        assert!(!tracking([(0, true)]).fault);
        let t = tracking([(0, false), (20, true)]);
        assert!(t.fault);
        assert_eq!(t.weight, 20);
        assert_eq!(tracking(std::iter::empty()), Tracking::default());
    }
}
