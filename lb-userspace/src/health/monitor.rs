//! The health monitor: one tokio task per target, each probing on its own jittered cadence, so
//! a backend that hangs delays nobody else. State changes go out as [`HealthEvent`]s; the
//! current picture is [`HealthMonitor::status`].
//!
//! Events go through an unbounded channel on purpose: a slow consumer must never stall the
//! checks, and the volume is bounded by the probe rate (changes need `rise`/`fall` probes).

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::config::{CheckKind, HealthConfig};
use super::probe::{FailureClass, ProbeSpec};
use super::tracker::{Health, Tracker, Transition};

/// One thing to check: a backend of a service, or a local service tracked for VRRP priority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// Chosen by the caller and unique per monitor, e.g. `"api/192.168.111.20"`.
    pub id: String,
    /// The backend's address with the service port; `config.port` overrides the port probed.
    pub addr: SocketAddr,
    pub config: HealthConfig,
    /// TLS server name and `Host` header; `None`: no SNI, `Host` is the address.
    pub sni: Option<String>,
    /// State before the first result. `Unknown` (the default) gets no traffic and the first
    /// result decides; a daemon adopting pinned state may start known backends `Up`.
    pub initial: Health,
    /// A TCP port that must accept before the check counts (a routed backend's `lbd decap`:
    /// without it the backend's own address answers while the VIP's packets are lost).
    pub gate: Option<SocketAddr>,
}

impl Target {
    pub fn new(id: impl Into<String>, addr: SocketAddr, config: HealthConfig) -> Self {
        Self {
            id: id.into(),
            addr,
            config,
            sni: None,
            initial: Health::Unknown,
            gate: None,
        }
    }

    pub fn gated(mut self, gate: SocketAddr) -> Self {
        self.gate = Some(gate);
        self
    }

    pub fn with_sni(mut self, sni: impl Into<String>) -> Self {
        self.sni = Some(sni.into());
        self
    }

    pub fn starting(mut self, initial: Health) -> Self {
        self.initial = initial;
        self
    }
}

fn spec_of(t: &Target) -> ProbeSpec {
    ProbeSpec::new(t.addr, &t.config, t.sni.as_deref()).with_gate(t.gate)
}

/// A target changed state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthEvent {
    pub id: String,
    /// The address probed.
    pub addr: SocketAddr,
    /// Whether it should receive new flows now (`state == Up`).
    pub healthy: bool,
    pub state: Health,
    pub previous: Health,
    /// The result that caused the change: `"ok"` or the failure.
    pub reason: String,
    /// What kind of failure the last result was (`None` when it passed). A target that is down
    /// also sends an event (with `state == previous`) when a failure of another kind follows,
    /// so a consumer always knows whether a down target refuses, resets or is merely slow.
    pub failure: FailureClass,
    pub at: SystemTime,
}

/// What the API shows for one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetStatus {
    pub id: String,
    /// The address probed.
    pub addr: SocketAddr,
    pub kind: CheckKind,
    pub state: Health,
    pub healthy: bool,
    /// Result of the last probe: `"ok"`, the failure, or `""` before the first.
    pub last_result: String,
    pub last_duration_ms: Option<u64>,
    pub last_check_unix_ms: Option<u64>,
    pub last_change_unix_ms: Option<u64>,
    pub consecutive_successes: u32,
    pub consecutive_failures: u32,
    pub checks_run: u64,
    pub checks_failed: u64,
}

/// The shared, lock-protected state of one target; locked only briefly, never across I/O.
#[derive(Debug)]
struct TargetState {
    id: String,
    addr: SocketAddr,
    kind: CheckKind,
    tracker: Tracker,
    last_result: String,
    failure: FailureClass,
    last_duration: Option<Duration>,
    last_check: Option<SystemTime>,
    last_change: Option<SystemTime>,
    checks_run: u64,
    checks_failed: u64,
}

impl TargetState {
    fn new(t: &Target, spec: &ProbeSpec) -> Self {
        Self {
            id: t.id.clone(),
            addr: spec.addr,
            kind: t.config.kind,
            tracker: Tracker::new(t.config.rise, t.config.fall, t.initial),
            last_result: String::new(),
            failure: FailureClass::None,
            last_duration: None,
            last_check: None,
            last_change: None,
            checks_run: 0,
            checks_failed: 0,
        }
    }

    fn status(&self) -> TargetStatus {
        TargetStatus {
            id: self.id.clone(),
            addr: self.addr,
            kind: self.kind,
            state: self.tracker.state(),
            healthy: self.tracker.state().is_up(),
            last_result: self.last_result.clone(),
            last_duration_ms: self.last_duration.map(|d| d.as_millis() as u64),
            last_check_unix_ms: self.last_check.map(unix_ms),
            last_change_unix_ms: self.last_change.map(unix_ms),
            consecutive_successes: self.tracker.consecutive_successes(),
            consecutive_failures: self.tracker.consecutive_failures(),
            checks_run: self.checks_run,
            checks_failed: self.checks_failed,
        }
    }

    /// Record one result; the event to send if it changed the state (or, while down, the kind
    /// of failure).
    fn record(
        &mut self,
        failure: FailureClass,
        reason: String,
        took: Duration,
    ) -> Option<HealthEvent> {
        let now = SystemTime::now();
        let ok = failure == FailureClass::None;
        self.checks_run += 1;
        if !ok {
            self.checks_failed += 1;
        }
        self.last_duration = Some(took);
        self.last_check = Some(now);
        crate::metrics::observe_health_check(&self.id, &self.kind.to_string(), took);
        let change = if failure.is_hard() {
            self.tracker.record_hard_failure()
        } else {
            self.tracker.record(ok)
        };
        let class_changed = std::mem::replace(&mut self.failure, failure) != failure;
        self.last_result = reason;
        match change {
            Some(t) => Some(self.event(t, now)),
            None if class_changed && !ok && self.tracker.state() == Health::Down => {
                let same = Transition {
                    from: Health::Down,
                    to: Health::Down,
                };
                let last_change = self.last_change;
                let ev = self.event(same, now);
                // Not a change of state: the state's age stays.
                self.last_change = last_change;
                Some(ev)
            }
            None => None,
        }
    }

    fn event(&mut self, t: Transition, at: SystemTime) -> HealthEvent {
        self.last_change = Some(at);
        HealthEvent {
            id: self.id.clone(),
            addr: self.addr,
            healthy: t.to.is_up(),
            state: t.to,
            previous: t.from,
            reason: self.last_result.clone(),
            failure: self.failure,
            at,
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Poisoning only means another task panicked mid-update of plain counters: keep going.
fn lock(m: &Mutex<TargetState>) -> MutexGuard<'_, TargetState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Entry {
    target: watch::Sender<Target>,
    state: Arc<Mutex<TargetState>>,
    task: JoinHandle<()>,
}

/// Runs the checks. Must be created inside a tokio runtime. Dropping it stops every task.
pub struct HealthMonitor {
    entries: Mutex<BTreeMap<String, Entry>>,
    events: mpsc::UnboundedSender<HealthEvent>,
}

impl HealthMonitor {
    /// Start checking `targets` (ids should be unique; a later duplicate replaces an earlier
    /// one). Returns the monitor and the stream of state changes.
    pub fn start(targets: Vec<Target>) -> (Self, mpsc::UnboundedReceiver<HealthEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let monitor = Self {
            entries: Mutex::new(BTreeMap::new()),
            events: tx,
        };
        monitor.set_targets(targets);
        (monitor, rx)
    }

    /// Replace the set of targets (config reload). Targets whose id stays keep their state and
    /// counters; a changed check (address, kind, path, interval, ...) applies from its next
    /// probe. Removed targets stop, without an event.
    pub fn set_targets(&self, targets: Vec<Target>) {
        let mut wanted = BTreeMap::new();
        for t in targets {
            wanted.insert(t.id.clone(), t);
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|id, e| {
            let keep = wanted.contains_key(id);
            if !keep {
                e.task.abort();
            }
            keep
        });
        for (id, t) in wanted {
            match entries.get(&id) {
                Some(e) => {
                    // Only wake the task when something changed.
                    e.target.send_if_modified(|cur| {
                        let changed = *cur != t;
                        *cur = t;
                        changed
                    });
                }
                None => {
                    let spec = spec_of(&t);
                    let state = Arc::new(Mutex::new(TargetState::new(&t, &spec)));
                    let (target, rx) = watch::channel(t);
                    let task = tokio::spawn(run_target(rx, state.clone(), self.events.clone()));
                    entries.insert(
                        id,
                        Entry {
                            target,
                            state,
                            task,
                        },
                    );
                }
            }
        }
    }

    /// Mark these targets down at once (their node died): no event is sent for this (the
    /// caller applies it); they come back with the usual event after `rise` passing probes.
    /// Returns the ids that were not down already.
    pub fn force_down(&self, ids: &[String], reason: &str) -> Vec<String> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = Vec::new();
        for id in ids {
            if let Some(e) = entries.get(id) {
                let mut st = lock(&e.state);
                if st.tracker.force_down().is_some() {
                    st.last_result = reason.to_string();
                    st.last_change = Some(SystemTime::now());
                    changed.push(id.clone());
                }
            }
        }
        changed
    }

    /// Every target's status, ordered by id.
    pub fn status(&self) -> Vec<TargetStatus> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.values().map(|e| lock(&e.state).status()).collect()
    }

    /// The current state of one target.
    pub fn state(&self, id: &str) -> Option<Health> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(id).map(|e| lock(&e.state).tracker.state())
    }

    /// Stop every check. The event stream ends once the monitor is dropped.
    pub fn stop(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for e in entries.values() {
            e.task.abort();
        }
        entries.clear();
    }
}

impl Drop for HealthMonitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A random number per call, from the std hasher's per-process random keys (no rand crate).
fn random_u64() -> u64 {
    RandomState::new().hash_one(Instant::now())
}

/// Time until the first probe: spread over one interval so targets started together do not
/// probe in lockstep.
fn first_delay(interval: Duration, r: u64) -> Duration {
    let us = interval.as_micros().max(1) as u64;
    Duration::from_micros(r % us)
}

/// The gap between two probe starts: up to 10% shorter than the interval, never longer, so
/// the detection bounds in the config docs hold while nodes and targets drift apart.
fn jittered(interval: Duration, r: u64) -> Duration {
    let us = interval.as_micros() as u64;
    Duration::from_micros(us - r % (us / 10 + 1))
}

async fn run_target(
    mut rx: watch::Receiver<Target>,
    state: Arc<Mutex<TargetState>>,
    events: mpsc::UnboundedSender<HealthEvent>,
) {
    let send = |ev: Option<HealthEvent>| {
        if let Some(ev) = ev {
            tracing::info!(id = %ev.id, addr = %ev.addr, state = ?ev.state, reason = %ev.reason, "health changed");
            // The receiver may be gone (daemon shutting down): nothing to tell then.
            let _ = events.send(ev);
        }
    };
    let mut target = rx.borrow_and_update().clone();
    let mut spec = spec_of(&target);
    let interval = |t: &Target| Duration::from_millis(t.config.interval_ms.max(1));
    let mut next = Instant::now() + first_delay(interval(&target), random_u64());
    loop {
        if target.config.kind == CheckKind::None {
            // No check: up at once and for good, whatever rise says.
            let ev = {
                let mut st = lock(&state);
                let from = st.tracker.state();
                st.tracker = Tracker::new(target.config.rise, target.config.fall, Health::Up);
                st.last_result = "no check configured".into();
                let to_up = Transition {
                    from,
                    to: Health::Up,
                };
                (from != Health::Up).then(|| st.event(to_up, SystemTime::now()))
            };
            send(ev);
            if rx.changed().await.is_err() {
                return;
            }
        } else {
            tokio::select! {
                _ = sleep_until(next) => {
                    let started = Instant::now();
                    let result = spec.run().await;
                    let (failure, reason) = match result {
                        Ok(()) => (FailureClass::None, "ok".to_string()),
                        Err(e) => (e.class(), e.to_string()),
                    };
                    let ev = lock(&state).record(failure, reason, started.elapsed());
                    send(ev);
                    next = started + jittered(interval(&target), random_u64());
                    continue;
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
        // The target changed (reload): new probe, new thresholds, same state.
        target = rx.borrow_and_update().clone();
        spec = spec_of(&target);
        {
            let mut st = lock(&state);
            st.addr = spec.addr;
            st.kind = target.config.kind;
            st.tracker
                .set_thresholds(target.config.rise, target.config.fall);
        }
        // A shorter interval takes effect now rather than after the old, longer wait.
        next = next.min(Instant::now() + interval(&target));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent_below() {
        let i = Duration::from_millis(200);
        for r in [0, 1, 19_999, 20_000, 20_001, u64::MAX] {
            let j = jittered(i, r);
            assert!(j <= i && j >= Duration::from_millis(180), "{j:?}");
        }
        assert_eq!(jittered(Duration::ZERO, 7), Duration::ZERO);
    }

    #[test]
    fn first_delay_is_within_one_interval() {
        let i = Duration::from_millis(200);
        for r in [0, 199_999, 200_000, u64::MAX] {
            assert!(first_delay(i, r) < i);
        }
        assert_eq!(first_delay(Duration::ZERO, 5), Duration::ZERO);
    }

    #[test]
    fn random_numbers_differ() {
        let a: Vec<u64> = (0..8).map(|_| random_u64()).collect();
        assert!(a.windows(2).any(|w| w[0] != w[1]));
    }
}
