//! What lbd knows about each backend's health, and the decisions that change it: a check's
//! result, a dead VRRP master's backends (fate sharing), the end of a failed backend's hold. The
//! plan (`lb-userspace`'s `plan`) reads these facts; [`handle`] is the one place that writes
//! them, and says with [`Effect`]s what the daemon must do next.
//!
//! The failed-backend hold: a backend that was up and fails takes no new flows from then on,
//! but its established flows stay for the hold (`failed_backend_hold_ms`), then move. A short
//! outage (a flapping readiness probe, a link flap, an apiserver that reports unready while it
//! finishes its requests) then costs no connection; haproxy likewise leaves established sessions
//! alone when a server goes down. A dead master's backends are taken out the same way: a node
//! that was only cut off (its lbd killed, a partition) loses nothing if it is back in time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// (VIP name, backend address).
pub type Pair = (String, IpAddr);

/// Health per (VIP name, backend); a backend with no fact was not checked yet, or has no check.
pub type HealthFacts = HashMap<Pair, HealthFact>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct HealthFact {
    pub healthy: bool,
    pub reason: String,
    /// A backend that went down after taking flows keeps its established flows until then (see
    /// [`flows_held`]); `None`: no hold (never up, or the hold is over).
    pub hold_until: Option<Instant>,
    /// Failing because the backend itself said no (refused or reset a connection) or its node
    /// was seen to die: never a fail-open target.
    pub hard: bool,
    /// Failing because nothing listens on the check port: with `absent_when_refused`, the
    /// backend is not expected up (no router on this node).
    pub refused: bool,
    /// When it stopped passing after having passed (fail-open takes the backends that failed
    /// together, see `plan::FAIL_OPEN_WINDOW`); `None` when failing or never seen up.
    pub down_since: Option<Instant>,
    /// When it passed again after failing (not its first result: a backend lbd finds serving
    /// when it starts has its full weight on every node): slow start runs from then (see
    /// `plan::slow_start_step`); `None`: full weight.
    pub up_since: Option<Instant>,
    /// Taken out because its node's VRRP master went silent (fate sharing): the reason says
    /// so until its checks pass again, also when they fail meanwhile (the node's death is the
    /// cause the operator needs; a failing check only confirms it).
    pub fate: bool,
}

impl HealthFact {
    /// A backend that was up failed at `now`: no new flows from now on; its established flows
    /// stay for `hold`, then move (see the module's documentation).
    pub fn failed(reason: String, now: Instant, hold: Duration) -> HealthFact {
        HealthFact {
            healthy: false,
            reason,
            hold_until: (!hold.is_zero()).then(|| now + hold),
            down_since: Some(now),
            ..Default::default()
        }
    }
}

/// Whether a failing backend still keeps its established flows at `now` (`None`: every hold
/// still applies).
pub fn flows_held(h: &HealthFact, now: Option<Instant>) -> bool {
    !h.healthy && h.hold_until.is_some_and(|t| now.is_none_or(|n| n < t))
}

/// Whether a hold has run out at `now` and is not ended yet: [`Input::Tick`] would rebuild.
pub fn holds_over(facts: &HealthFacts, now: Instant) -> bool {
    facts
        .values()
        .any(|h| h.hold_until.is_some_and(|t| t <= now))
}

/// A backend out for less than this is back at full weight at once: a blip (a few slow checks
/// on a loaded node) is not the restart slow start is for (a rebooted apiserver is out for
/// minutes), and each climb is a stretch in which this node's table differs from the peers'.
pub const SLOW_START_MIN_OUTAGE: Duration = Duration::from_secs(10);

/// When a backend that passes at `now` starts its slow start: after it was down (`was_down`;
/// not a first result, lbd starting: it was serving, and the peers give it its full weight),
/// unless it went down less than [`SLOW_START_MIN_OUTAGE`] ago after having been up (`old`,
/// its fact until now). A backend never seen up climbs: it is ready for the first time.
pub fn slow_start_from(was_down: bool, old: Option<&HealthFact>, now: Instant) -> Option<Instant> {
    let blip = old
        .and_then(|h| h.down_since)
        .is_some_and(|t| now.saturating_duration_since(t) < SLOW_START_MIN_OUTAGE);
    (was_down && !blip).then_some(now)
}

/// A health check's verdict on one backend, as the monitor reports a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub pair: Pair,
    /// It takes new flows now.
    pub healthy: bool,
    /// `"ok"` or the failure.
    pub reason: String,
    /// Its state before: `Some(true)` up, `Some(false)` down, `None` no result yet.
    pub previous: Option<bool>,
    /// The failure was a refusal or a reset (the backend itself said no).
    pub hard: bool,
    /// The failure was a refusal (nothing listens on the check port).
    pub refused: bool,
}

/// What happened to the backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A backend's check result changed (or, while down, the kind of failure).
    Check(Check),
    /// `instance`'s master `peer` went silent and this node took over: `pairs` are the
    /// backends at its address (`plan::fate_shared`).
    DeadMaster {
        instance: String,
        peer: IpAddr,
        pairs: Vec<Pair>,
    },
    /// Time passed: holds that ended let their backends' flows move.
    Tick,
}

/// What the daemon does about it, in this order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Mark these checks (`"VIP/backend"` ids) down at once in the health monitor: they come
    /// back through the normal rise count.
    ForceDown { ids: Vec<String>, reason: String },
    /// Rebuild the plan from the facts and write it to the data plane.
    Apply,
}

/// Apply `input` at `now` to `facts`; `hold` is how long a failed backend's established flows
/// stay (`failed_backend_hold_ms`).
pub fn handle(facts: &mut HealthFacts, hold: Duration, now: Instant, input: Input) -> Vec<Effect> {
    match input {
        Input::Check(c) => {
            let old = facts.get(&c.pair);
            let fact = match old {
                // Back, or ready for the first time after failing: slow start.
                old if c.healthy => HealthFact {
                    healthy: true,
                    reason: c.reason,
                    up_since: slow_start_from(c.previous == Some(false), old, now),
                    ..Default::default()
                },
                // Already failing (e.g. taken out by fate sharing): its hold runs on; the kind
                // of failure may have changed (slow, then refused).
                Some(old) if !old.healthy => HealthFact {
                    reason: if old.fate {
                        old.reason.clone()
                    } else {
                        c.reason
                    },
                    hard: c.hard,
                    refused: c.refused,
                    ..old.clone()
                },
                // Up until now: it may hold established flows.
                Some(_) if c.previous == Some(true) => HealthFact {
                    hard: c.hard,
                    refused: c.refused,
                    ..HealthFact::failed(c.reason, now, hold)
                },
                _ => HealthFact {
                    healthy: false,
                    reason: c.reason,
                    hard: c.hard,
                    refused: c.refused,
                    ..Default::default()
                },
            };
            facts.insert(c.pair, fact);
            vec![Effect::Apply]
        }
        Input::DeadMaster {
            instance,
            peer,
            pairs,
        } => {
            if pairs.is_empty() {
                return Vec::new();
            }
            let reason = format!(
                "VRRP master {peer} of {instance} went silent; out until its checks pass again"
            );
            let ids = pairs.iter().map(|(v, a)| format!("{v}/{a}")).collect();
            for pair in pairs {
                let fact = match facts.get(&pair) {
                    Some(old) if !old.healthy => HealthFact {
                        reason: reason.clone(),
                        hard: true,
                        fate: true,
                        ..old.clone()
                    },
                    // A dead node is never a fail-open target.
                    _ => HealthFact {
                        hard: true,
                        fate: true,
                        ..HealthFact::failed(reason.clone(), now, hold)
                    },
                };
                facts.insert(pair, fact);
            }
            vec![Effect::ForceDown { ids, reason }, Effect::Apply]
        }
        Input::Tick => {
            if !holds_over(facts, now) {
                return Vec::new();
            }
            for h in facts.values_mut() {
                if h.hold_until.is_some_and(|t| t <= now) {
                    h.hold_until = None;
                }
            }
            vec![Effect::Apply]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(30);

    fn pair(a: &str) -> Pair {
        ("api".into(), a.parse().unwrap())
    }

    fn check(a: &str, healthy: bool, previous: Option<bool>) -> Input {
        Input::Check(Check {
            pair: pair(a),
            healthy,
            reason: if healthy { "ok" } else { "timeout" }.into(),
            previous,
            hard: false,
            refused: false,
        })
    }

    fn dead(peer: &str, backends: &[&str]) -> Input {
        Input::DeadMaster {
            instance: "api".into(),
            peer: peer.parse().unwrap(),
            pairs: backends.iter().map(|a| pair(a)).collect(),
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_backend_that_was_up_keeps_its_flows_for_the_hold_then_they_move() {
        let t0 = Instant::now();
        let mut f = HealthFacts::new();
        handle(&mut f, HOLD, t0, check("10.0.0.1", true, None));
        assert_eq!(
            handle(
                &mut f,
                HOLD,
                t0 + s(5),
                check("10.0.0.1", false, Some(true))
            ),
            vec![Effect::Apply]
        );
        let h = &f[&pair("10.0.0.1")];
        assert!(!h.healthy);
        assert_eq!(h.hold_until, Some(t0 + s(35)));
        assert_eq!(h.down_since, Some(t0 + s(5)));
        assert!(flows_held(h, Some(t0 + s(34))));
        // Nothing ends before the hold does; at its end the flows move (one rebuild).
        assert!(!holds_over(&f, t0 + s(34)));
        assert!(handle(&mut f, HOLD, t0 + s(34), Input::Tick).is_empty());
        assert!(holds_over(&f, t0 + s(35)));
        assert_eq!(
            handle(&mut f, HOLD, t0 + s(35), Input::Tick),
            vec![Effect::Apply]
        );
        assert!(!flows_held(&f[&pair("10.0.0.1")], Some(t0 + s(35))));
        assert!(handle(&mut f, HOLD, t0 + s(36), Input::Tick).is_empty());
    }

    #[test]
    fn a_backend_never_up_holds_nothing_and_a_zero_hold_none_either() {
        let t0 = Instant::now();
        let mut f = HealthFacts::new();
        handle(&mut f, HOLD, t0, check("10.0.0.1", false, None));
        assert_eq!(f[&pair("10.0.0.1")].hold_until, None);
        handle(&mut f, HOLD, t0, check("10.0.0.2", true, None));
        handle(
            &mut f,
            Duration::ZERO,
            t0,
            check("10.0.0.2", false, Some(true)),
        );
        assert_eq!(f[&pair("10.0.0.2")].hold_until, None);
    }

    #[test]
    fn a_dead_masters_backends_go_out_at_once_with_the_hold_and_their_checks_keep_it() {
        let t0 = Instant::now();
        let mut f = HealthFacts::new();
        handle(&mut f, HOLD, t0, check("10.0.0.2", true, None));
        // The dead master's report comes first (see `vrrp::hold`): out before this node
        // forwards, hard (never a fail-open target), held.
        let out = handle(&mut f, HOLD, t0 + s(1), dead("10.0.0.2", &["10.0.0.2"]));
        let reason = "VRRP master 10.0.0.2 of api went silent; out until its checks pass again";
        assert_eq!(
            out,
            vec![
                Effect::ForceDown {
                    ids: vec!["api/10.0.0.2".into()],
                    reason: reason.into()
                },
                Effect::Apply
            ]
        );
        let h = f[&pair("10.0.0.2")].clone();
        assert!(!h.healthy && h.hard);
        assert_eq!(h.hold_until, Some(t0 + s(31)));
        // Its checks then fail (the forced down, then a timeout): the hold runs on from the
        // report, not from the check; the kind of failure follows the check, the reason stays
        // the node's death (what the operator needs to see) until the checks pass.
        handle(
            &mut f,
            HOLD,
            t0 + s(4),
            check("10.0.0.2", false, Some(false)),
        );
        let later = &f[&pair("10.0.0.2")];
        assert_eq!(later.hold_until, Some(t0 + s(31)));
        assert_eq!(later.reason, reason);
        assert!(!later.hard);
        assert!(later.fate);
        // A second report of a backend already out keeps its hold too.
        handle(&mut f, HOLD, t0 + s(10), dead("10.0.0.2", &["10.0.0.2"]));
        assert_eq!(f[&pair("10.0.0.2")].hold_until, Some(t0 + s(31)));
        assert!(f[&pair("10.0.0.2")].hard);
        // A dead master with no backend here changes nothing.
        assert!(handle(&mut f, HOLD, t0, dead("10.0.0.9", &[])).is_empty());
        // Its checks pass again: the node's death is over, and so is the reason.
        handle(
            &mut f,
            HOLD,
            t0 + s(40),
            check("10.0.0.2", true, Some(false)),
        );
        let back = &f[&pair("10.0.0.2")];
        assert!(back.healthy && !back.fate);
        assert_eq!(back.reason, "ok");
    }

    #[test]
    fn back_after_an_outage_climbs_but_not_after_a_blip_or_at_start() {
        let t0 = Instant::now();
        let mut f = HealthFacts::new();
        // First result: full weight (it was serving before lbd started).
        handle(&mut f, HOLD, t0, check("10.0.0.1", true, None));
        assert_eq!(f[&pair("10.0.0.1")].up_since, None);
        // A blip: full weight again at once.
        handle(
            &mut f,
            HOLD,
            t0 + s(1),
            check("10.0.0.1", false, Some(true)),
        );
        handle(
            &mut f,
            HOLD,
            t0 + s(3),
            check("10.0.0.1", true, Some(false)),
        );
        assert_eq!(f[&pair("10.0.0.1")].up_since, None);
        // A real outage: slow start from its return.
        handle(
            &mut f,
            HOLD,
            t0 + s(10),
            check("10.0.0.1", false, Some(true)),
        );
        let back = t0 + s(10) + SLOW_START_MIN_OUTAGE;
        handle(&mut f, HOLD, back, check("10.0.0.1", true, Some(false)));
        assert_eq!(f[&pair("10.0.0.1")].up_since, Some(back));
        assert_eq!(f[&pair("10.0.0.1")].hold_until, None);
    }
}
