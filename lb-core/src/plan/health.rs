//! The plan's health policies over a service's backends (pure): fail-open when every backend
//! fails softly at once, and slow start's weight steps after a backend returns.

use std::{net::IpAddr, time::Duration};

use super::{BackendPlan, BackendState, Facts};
use crate::desired::BackendSpec;

/// Fail-open takes the backends that stopped passing within this long of the last one to stop:
/// a latency spike (etcd, the network) fails every backend within a few check periods of each
/// other; a backend that went down long before the others did so on its own, and stays out.
pub const FAIL_OPEN_WINDOW: Duration = Duration::from_secs(10);

/// Slow start: the step (1..=[`SLOW_START_STEPS`]) of a backend's weight it has for new flows
/// `elapsed` after it returned; `SLOW_START_STEPS` is full weight. The first step is taken at
/// once (1/20 of the weight, about haproxy's first `slowstart` step), the last one `period`
/// after the return.
pub fn slow_start_step(elapsed: Duration, period: Duration) -> u32 {
    if period.is_zero() || elapsed >= period {
        return SLOW_START_STEPS;
    }
    let step = elapsed.as_nanos() * SLOW_START_STEPS as u128 / period.as_nanos();
    (step as u32 + 1).min(SLOW_START_STEPS)
}

pub use crate::config::health::SLOW_START_STEPS;

pub use crate::backends::{SLOW_START_MIN_OUTAGE, slow_start_from};

/// Fail-open: when no backend of `v` passes its checks, the ones that failed softly (slow,
/// wrong answer: not refused, not reset, not on a dead node) and together (within
/// [`FAIL_OPEN_WINDOW`] of the last to fail) take new flows again, rather than the VIP dropping
/// every new connection: an etcd latency spike that slows every apiserver's `/readyz` past the
/// check timeout leaves the API served, as haproxy (10 s check timeout) would. It ends as soon as
/// one backend passes. Drained, weight-0 and unresolved backends stay out; so does a service
/// without checks or with `fail_open = false`.
pub(super) fn fail_open(
    v: &crate::config::VipConfig,
    facts: &Facts,
    specs: &mut [BackendSpec],
    rows: &mut [BackendPlan],
) {
    if !v.health.fail_open || v.health.kind == crate::config::health::CheckKind::None {
        return;
    }
    let fact = |addr: IpAddr| facts.health.get(&(v.name.clone(), addr));
    let passing = specs
        .iter()
        .any(|s| s.weight > 0 && fact(s.addr).is_none_or(|h| h.healthy));
    if passing {
        return;
    }
    let soft = |s: &BackendSpec| {
        let h = fact(s.addr)?;
        let usable = s.weight > 0 && !s.drained && (s.local || s.mac.is_some());
        (usable && !h.healthy && !h.hard).then_some(h.down_since?)
    };
    let Some(last) = specs.iter().filter_map(soft).max() else {
        return;
    };
    for (s, r) in specs.iter_mut().zip(rows.iter_mut()) {
        if soft(s).is_some_and(|t| t + FAIL_OPEN_WINDOW >= last) {
            s.healthy = true;
            s.failing = false;
            r.state = BackendState::FailOpen;
            r.reason = format!(
                "fail-open: every backend of {} fails its checks ({}); new flows still come here until one passes",
                v.name,
                fact(s.addr).map(|h| h.reason.as_str()).unwrap_or_default()
            );
            debug_assert!(s.in_table());
        }
    }
}

/// The VIPs (by name) some of whose backends serve by fail-open.
pub fn failing_open(rows: &[BackendPlan]) -> Vec<String> {
    let mut v: Vec<String> = rows
        .iter()
        .filter(|r| r.state == BackendState::FailOpen)
        .map(|r| r.vip.clone())
        .collect();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{HealthFact, plan};
    use std::time::Instant;

    use crate::plan::tests::cfg;

    /// Every backend resolved (10.0.0.1-4), 10.0.0.4 drained: the four facts given, at `t0`.
    fn failing_facts(t0: Instant, facts: [HealthFact; 4]) -> Facts {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut f = Facts::default();
        for (i, fact) in facts.into_iter().enumerate() {
            let a = ip(&format!("10.0.0.{}", i + 1));
            f.macs.insert(a, [2, 0, 0, 0, 0, i as u8]);
            f.health.insert(("api".into(), a), fact);
        }
        f.drained.insert(("api".into(), ip("10.0.0.4")));
        f.now = Some(t0);
        f
    }

    fn slow(at: Instant) -> HealthFact {
        HealthFact::failed(
            "timeout after 200 ms during response".into(),
            at,
            Duration::ZERO,
        )
    }

    fn states(rows: &[BackendPlan]) -> Vec<BackendState> {
        rows.iter().map(|r| r.state).collect()
    }

    #[test]
    fn every_backend_slow_at_once_fails_open_to_them_until_one_passes() {
        use BackendState::*;
        let cfg = cfg();
        let t0 = Instant::now();
        let refused = HealthFact {
            hard: true,
            refused: true,
            ..HealthFact::failed("connection refused".into(), t0, Duration::ZERO)
        };
        // 10.0.0.1 and .2 slow within the window; .3 refused (dead: stays out); .4 drained (an
        // operator's choice: stays out).
        let mut f = failing_facts(
            t0 + Duration::from_secs(30),
            [
                slow(t0 + Duration::from_secs(20)),
                slow(t0 + Duration::from_secs(25)),
                refused,
                slow(t0),
            ],
        );
        let (d, rows) = plan(&cfg, &f);
        assert_eq!(states(&rows), [FailOpen, FailOpen, Down, Down]);
        let b = &d.services[0].backends;
        assert!(b[0].in_table() && b[1].in_table());
        assert!(!b[2].in_table() && !b[3].in_table());
        assert!(
            rows[0].reason.starts_with("fail-open"),
            "{}",
            rows[0].reason
        );
        assert_eq!(failing_open(&rows), ["api"]);

        // One that failed long before the rest did so on its own: not part of the set.
        f.health
            .insert(("api".into(), "10.0.0.1".parse().unwrap()), slow(t0));
        let (_, rows) = plan(&cfg, &f);
        assert_eq!(states(&rows), [Down, FailOpen, Down, Down]);

        // One passes: fail-open is over at once.
        f.health.insert(
            ("api".into(), "10.0.0.3".parse().unwrap()),
            HealthFact {
                healthy: true,
                reason: "ok".into(),
                ..Default::default()
            },
        );
        let (_, rows) = plan(&cfg, &f);
        assert_eq!(states(&rows), [Down, Down, Active, Down]);
        assert!(failing_open(&rows).is_empty());

        // Every failure hard (refused, reset, dead node): nothing to fail open to.
        let hard = |at| HealthFact {
            hard: true,
            ..slow(at)
        };
        let f = failing_facts(t0, [hard(t0), hard(t0), hard(t0), hard(t0)]);
        let (_, rows) = plan(&cfg, &f);
        assert_eq!(states(&rows), [Down, Down, Down, Down]);

        // Never seen up (lbd just started, every check slow): no set to go back to.
        let never = || HealthFact {
            reason: "timeout".into(),
            ..Default::default()
        };
        let f = failing_facts(t0, [never(), never(), never(), never()]);
        assert_eq!(states(&plan(&cfg, &f).1), [Down, Down, Down, Down]);

        // Switched off.
        let mut off = cfg.clone();
        off.vips[0].health.fail_open = false;
        let f = failing_facts(t0, [slow(t0), slow(t0), slow(t0), slow(t0)]);
        assert_eq!(states(&plan(&off, &f).1), [Down, Down, Down, Down]);
    }

    #[test]
    fn a_refused_check_with_absent_when_refused_is_absent_not_down() {
        use BackendState::*;
        let mut cfg = cfg();
        let t0 = Instant::now();
        let refused = || HealthFact {
            hard: true,
            refused: true,
            reason: "connection refused".into(),
            ..Default::default()
        };
        let ok = || HealthFact {
            healthy: true,
            reason: "ok".into(),
            ..Default::default()
        };
        let f = failing_facts(t0, [refused(), ok(), slow(t0), ok()]);
        let (_, rows) = plan(&cfg, &f);
        assert_eq!(states(&rows), [Down, Active, Down, Drained]);
        assert!(rows.iter().all(|r| r.expected));
        cfg.vips[0].health.absent_when_refused = true;
        let (d, rows) = plan(&cfg, &f);
        assert_eq!(states(&rows), [Absent, Active, Down, Drained]);
        assert!(!rows[0].expected && rows[1].expected && rows[2].expected);
        assert!(!d.services[0].backends[0].in_set());
        assert!(
            rows[0].reason.contains("nothing serves here"),
            "{}",
            rows[0].reason
        );
    }

    #[test]
    fn slow_start_follows_a_real_outage_not_a_blip_nor_lbd_starting() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let down_at = |t| HealthFact::failed("timeout".into(), t, Duration::ZERO);
        // lbd starting: the first result is up.
        assert_eq!(slow_start_from(false, None, t0), None);
        // Never seen up, ready now: it climbs.
        let never = HealthFact::default();
        assert_eq!(slow_start_from(true, Some(&never), t0), Some(t0));
        // Out for 3 s: a blip, full weight at once; out for a minute: it climbs.
        assert_eq!(
            slow_start_from(true, Some(&down_at(t0)), t0 + secs(3)),
            None
        );
        assert_eq!(
            slow_start_from(true, Some(&down_at(t0)), t0 + secs(60)),
            Some(t0 + secs(60))
        );
    }

    #[test]
    fn slow_start_climbs_in_steps_of_the_new_flow_weight() {
        let period = Duration::from_secs(60);
        assert_eq!(slow_start_step(Duration::ZERO, period), 1);
        assert_eq!(slow_start_step(Duration::from_secs(2), period), 1);
        assert_eq!(slow_start_step(Duration::from_secs(3), period), 2);
        assert_eq!(slow_start_step(Duration::from_secs(30), period), 11);
        assert_eq!(slow_start_step(Duration::from_millis(59_999), period), 20);
        assert_eq!(slow_start_step(period, period), SLOW_START_STEPS);
        assert_eq!(
            slow_start_step(Duration::ZERO, Duration::ZERO),
            SLOW_START_STEPS
        );

        let mut cfg = cfg();
        cfg.vips[0].health.slow_start_ms = 60_000;
        let t0 = Instant::now();
        let up = |since| HealthFact {
            healthy: true,
            reason: "ok".into(),
            up_since: since,
            ..Default::default()
        };
        let mut f = failing_facts(t0, [up(Some(t0)), up(None), up(None), up(None)]);
        f.now = Some(t0 + Duration::from_secs(15));
        let (d, rows) = plan(&cfg, &f);
        assert_eq!(rows[0].state, BackendState::Active);
        assert_eq!((rows[0].step, rows[1].step), (6, SLOW_START_STEPS));
        assert!(rows[0].ramping() && !rows[1].ramping());
        assert!(
            rows[0].reason.contains("slow start: 30%"),
            "{}",
            rows[0].reason
        );
        assert!(rows[0].reason.contains("full in 45s"), "{}", rows[0].reason);
        assert_eq!(d.services[0].backends[0].step, 6);
        f.now = Some(t0 + period);
        let (d, rows) = plan(&cfg, &f);
        assert!(!rows[0].ramping());
        assert_eq!(d.services[0].backends[0].step, SLOW_START_STEPS);
        // Without a slow-start period: full weight at once.
        cfg.vips[0].health.slow_start_ms = 0;
        f.now = Some(t0);
        assert_eq!(plan(&cfg, &f).1[0].step, SLOW_START_STEPS);
    }
}
