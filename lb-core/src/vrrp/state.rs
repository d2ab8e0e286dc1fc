//! The VRRP state machine (RFC 9568 section 6.4, which for these rules matches RFC 3768) as a
//! pure function of (state, event, time).
//!
//! [`Machine::handle`] takes the current time as a value and returns what to do as [`Action`]s;
//! it never reads a clock or touches a socket, so every timing rule is unit-tested exactly. The
//! instance task (`instance.rs`) turns real time and packets into [`Event`]s and carries out the
//! actions. One timer is enough: the master-down timer in Backup, the advert timer in Master.

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

/// A point in time: the duration since an epoch the caller chooses (e.g. its start).
pub type Time = Duration;

/// The transition reason when the master went silent (it died, or we lost it).
pub const REASON_MASTER_DOWN: &str = "master down timer expired";
/// The master-down timer expired while a lower-priority master was still advertising: we
/// preempted it (it is alive, so no fate sharing).
pub const REASON_PREEMPT: &str = "preempted a lower-priority master";

/// Immediate answers to conflicting adverts are at least this fraction of our interval apart.
pub const ANSWER_GAP: u32 = 4;

/// Priority that marks the address owner: it becomes master at once and is never preempted.
pub const OWNER_PRIORITY: u8 = 255;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Not started, or shut down.
    Initialize,
    Backup,
    Master,
    /// The interface is down, or a tracked check of weight 0 fails: we neither own the VIPs
    /// nor take part in elections.
    Fault,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Initialize => "initialize",
            State::Backup => "backup",
            State::Master => "master",
            State::Fault => "fault",
        }
    }
}

/// Fixed parameters of one virtual router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Configured priority, 1..=255 (255: address owner).
    pub base_priority: u8,
    /// Our advertisement interval (sent when master).
    pub advert_interval: Duration,
    /// Preempt a lower-priority master (RFC default: true; keepalived's `nopreempt` = false).
    pub preempt: bool,
    /// Wait this long before preempting a lower-priority master, counted from the first
    /// lower-priority advert heard since we last became backup (keepalived's `preempt_delay`).
    pub preempt_delay: Duration,
    /// Our primary address on the link: the advert source and the election tie-breaker.
    pub primary_addr: IpAddr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Startup,
    /// Graceful stop: a master sends a priority-0 advert so a backup takes over at once.
    Shutdown,
    /// The timer set by the last [`Action::SetTimer`] may have expired. Early calls are ignored.
    TimerFired,
    /// A valid advert for our VRID (already checked by the codec and the instance).
    AdvertReceived {
        from: IpAddr,
        priority: u8,
        /// The sender's advertisement interval.
        interval: Duration,
    },
    InterfaceDown,
    InterfaceUp,
    /// A tracked check of weight 0 fails (`true`) or all such checks pass again (`false`):
    /// keepalived's FAULT, like a link down (the shell's `vrrp::track`).
    TrackFault(bool),
    /// New effective priority (see [`effective_priority`]).
    PriorityChanged(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    SendAdvert {
        priority: u8,
    },
    /// We became master: add the VIPs, announce them (GARP / NA), set data-plane ownership.
    TakeOwnership,
    /// We stopped being master: remove the VIPs and clear data-plane ownership.
    ReleaseOwnership,
    /// (Re)arm the single timer for this absolute time.
    SetTimer(Time),
    CancelTimer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub reason: &'static str,
}

/// Another router claimed mastership while we were master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitBrain {
    pub peer: IpAddr,
    pub peer_priority: u8,
    /// True when the peer won and we stepped down; false when we kept mastership and answered
    /// with an advert of our own so the peer steps down.
    pub stepped_down: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub actions: Vec<Action>,
    pub transition: Option<Transition>,
    pub split_brain: Option<SplitBrain>,
}

/// Effective priority: the base plus tracked weights, kept within 1..=254 so tracking can
/// neither make a router the address owner nor make it resign (priority 0). An owner (255)
/// is not affected by tracking.
pub fn effective_priority(base: u8, weights: i32) -> u8 {
    if base == OWNER_PRIORITY {
        return OWNER_PRIORITY;
    }
    (i64::from(base) + i64::from(weights)).clamp(1, 254) as u8
}

/// Skew_Time = ((256 - priority) * interval) / 256 (RFC 9568 section 6.1): lower priorities
/// wait longer, so the highest-priority backup wins the race to become master.
pub fn skew_time(priority: u8, interval: Duration) -> Duration {
    let micros = (256 - u128::from(priority)) * interval.as_micros() / 256;
    Duration::from_micros(micros as u64)
}

/// Master_Down_Interval = 3 * interval + Skew_Time.
pub fn master_down_interval(priority: u8, interval: Duration) -> Duration {
    interval * 3 + skew_time(priority, interval)
}

#[derive(Clone, Debug)]
pub struct Machine {
    params: Params,
    state: State,
    priority: u8,
    /// The master's advertised interval (our own until we hear one).
    master_interval: Duration,
    master_addr: Option<IpAddr>,
    timer: Option<Time>,
    /// When the preempt delay ends: set by the first lower-priority advert heard as backup,
    /// cleared when we become backup again or a master at least our priority is heard.
    preempt_at: Option<Time>,
    /// When we last sent an advert: answers to conflicting adverts are limited to one per
    /// [`ANSWER_GAP`] of our interval, so a flood of adverts cannot make us send a flood.
    last_sent: Option<Time>,
    iface_down: bool,
    /// A tracked check of weight 0 fails.
    track_fault: bool,
    /// The current master resigned (priority 0); only used to explain the next transition.
    master_resigned: bool,
    /// When we last ignored a lower-priority master's advert (to preempt it): a master that is
    /// still heard when our timer fires was preempted, not lost.
    lower_master_heard: Option<Time>,
}

impl Machine {
    pub fn new(params: Params) -> Self {
        let priority = params.base_priority;
        let master_interval = params.advert_interval;
        Machine {
            params,
            state: State::Initialize,
            priority,
            master_interval,
            master_addr: None,
            timer: None,
            preempt_at: None,
            last_sent: None,
            iface_down: false,
            track_fault: false,
            master_resigned: false,
            lower_master_heard: None,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }
    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn effective_priority(&self) -> u8 {
        self.priority
    }
    /// The current master as far as we know (ourselves when master).
    pub fn master_addr(&self) -> Option<IpAddr> {
        self.master_addr
    }
    /// The interval the master advertises (ours when master).
    pub fn master_interval(&self) -> Duration {
        self.master_interval
    }
    pub fn timer(&self) -> Option<Time> {
        self.timer
    }

    /// Apply `event` at time `now`.
    pub fn handle(&mut self, now: Time, event: Event) -> Output {
        let out = self.handle_inner(now, event);
        if out
            .actions
            .iter()
            .any(|a| matches!(a, Action::SendAdvert { .. }))
        {
            self.last_sent = Some(now);
        }
        if out.transition.is_some_and(|t| t.to == State::Backup) {
            self.preempt_at = None;
        }
        out
    }

    /// Change parameters in place (a reload that changed priority, interval or preemption):
    /// no resignation, no state change. A master's next advert carries the new values; a
    /// backup uses them from the next advert it hears.
    pub fn reconfigure(&mut self, now: Time, params: Params, effective: u8) -> Output {
        let mut out = Output::default();
        let interval_changed = params.advert_interval != self.params.advert_interval;
        self.params = params;
        self.priority = if self.params.base_priority == OWNER_PRIORITY {
            OWNER_PRIORITY
        } else {
            effective.clamp(1, 254)
        };
        if self.state == State::Master {
            self.master_interval = self.params.advert_interval;
            if interval_changed {
                out.actions.push(Action::SendAdvert {
                    priority: self.priority,
                });
                self.last_sent = Some(now);
                self.set_timer(&mut out, now + self.params.advert_interval);
            }
        }
        out
    }

    fn handle_inner(&mut self, now: Time, event: Event) -> Output {
        let mut out = Output::default();
        match event {
            Event::Startup => {
                if self.state == State::Initialize {
                    if self.iface_down {
                        self.go(&mut out, State::Fault, "interface down at startup");
                    } else if self.track_fault {
                        self.go(&mut out, State::Fault, "tracked check failing at startup");
                    } else {
                        self.start(now, &mut out, "startup");
                    }
                }
            }
            Event::Shutdown => match self.state {
                State::Initialize => {}
                State::Master => {
                    self.cancel_timer(&mut out);
                    out.actions.push(Action::SendAdvert { priority: 0 });
                    out.actions.push(Action::ReleaseOwnership);
                    self.go(&mut out, State::Initialize, "shutdown");
                }
                State::Backup | State::Fault => {
                    self.cancel_timer(&mut out);
                    self.go(&mut out, State::Initialize, "shutdown");
                }
            },
            Event::InterfaceDown => {
                self.iface_down = true;
                match self.state {
                    State::Master => {
                        self.cancel_timer(&mut out);
                        out.actions.push(Action::ReleaseOwnership);
                        self.go(&mut out, State::Fault, "interface down");
                    }
                    State::Backup => {
                        self.cancel_timer(&mut out);
                        self.go(&mut out, State::Fault, "interface down");
                    }
                    State::Initialize | State::Fault => {}
                }
            }
            Event::InterfaceUp => {
                self.iface_down = false;
                if self.state == State::Fault && !self.track_fault {
                    self.start(now, &mut out, "interface up");
                }
            }
            Event::TrackFault(failing) => {
                self.track_fault = failing;
                match (failing, self.state) {
                    (true, State::Master) => {
                        self.cancel_timer(&mut out);
                        // Resign like a shutdown: the backup takes over after its skew.
                        out.actions.push(Action::SendAdvert { priority: 0 });
                        out.actions.push(Action::ReleaseOwnership);
                        self.go(&mut out, State::Fault, "tracked check failing");
                    }
                    (true, State::Backup) => {
                        self.cancel_timer(&mut out);
                        self.go(&mut out, State::Fault, "tracked check failing");
                    }
                    (false, State::Fault) if !self.iface_down => {
                        self.start(now, &mut out, "tracked check passing again");
                    }
                    _ => {}
                }
            }
            Event::PriorityChanged(p) => {
                // An owner stays an owner; others cannot become one (or resign) by tracking.
                if self.params.base_priority != OWNER_PRIORITY {
                    self.priority = p.clamp(1, 254);
                }
                // A master's next advert carries the new value; a backup's skew uses it from the
                // next advert on. Neither needs to act now.
            }
            Event::TimerFired => {
                if self.timer.is_none_or(|t| now < t) {
                    return out;
                }
                match self.state {
                    State::Backup => {
                        let heard = self.lower_master_heard.take().is_some_and(|t| {
                            now < t + master_down_interval(self.priority, self.master_interval)
                        });
                        let reason = if self.master_resigned {
                            "master resigned (priority 0 advert)"
                        } else if heard {
                            REASON_PREEMPT
                        } else {
                            REASON_MASTER_DOWN
                        };
                        self.become_master(now, &mut out, reason);
                    }
                    State::Master => {
                        out.actions.push(Action::SendAdvert {
                            priority: self.priority,
                        });
                        self.set_timer(&mut out, now + self.params.advert_interval);
                    }
                    State::Initialize | State::Fault => self.timer = None,
                }
            }
            Event::AdvertReceived {
                from,
                priority,
                interval,
            } => {
                if from != self.params.primary_addr {
                    self.on_advert(now, &mut out, from, priority, interval);
                } else if priority == 0 && self.state == State::Master {
                    // A resignation in our name that we did not send (a host on the segment
                    // forging our address): assert ourselves at once, so the backups restart
                    // their master-down timers before their skew runs out.
                    self.answer(now, &mut out);
                }
            }
        }
        out
    }

    fn on_advert(
        &mut self,
        now: Time,
        out: &mut Output,
        from: IpAddr,
        priority: u8,
        interval: Duration,
    ) {
        match self.state {
            State::Backup => {
                if priority == 0 {
                    // A resignation counts only from the master we follow (or any, before we
                    // heard one): a priority-0 advert from another host is noise.
                    if self.master_addr.is_some_and(|m| m != from) {
                        return;
                    }
                    // The master resigned: take over after the skew only (RFC 9568 6.4.2, and
                    // keepalived, which a mixed cluster must match or a planned restart moves
                    // the VIP twice); the skew keeps the highest-priority backup first. A
                    // forged resignation has to come from our own segment (TTL 255).
                    self.master_resigned = true;
                    let at = now + skew_time(self.priority, self.master_interval);
                    self.set_timer(out, at);
                } else if priority >= self.priority || !self.may_preempt(now) {
                    if priority >= self.priority {
                        // A legitimate master: the next lower one starts the delay afresh.
                        self.preempt_at = None;
                    }
                    self.master_resigned = false;
                    self.master_interval = interval;
                    self.master_addr = Some(from);
                    let at = now + master_down_interval(self.priority, interval);
                    self.set_timer(out, at);
                } else {
                    // A lower-priority master while we may preempt: ignore it, and our
                    // master-down timer makes us take over (remembering it was alive).
                    self.lower_master_heard = Some(now);
                }
            }
            State::Master => {
                if priority == 0 {
                    // Another router left: assert ourselves at once (RFC 9568 6.4.3).
                    self.answer(now, out);
                } else if priority > self.priority
                    || (priority == self.priority && from > self.params.primary_addr)
                {
                    out.split_brain = Some(SplitBrain {
                        peer: from,
                        peer_priority: priority,
                        stepped_down: true,
                    });
                    self.master_interval = interval;
                    self.master_addr = Some(from);
                    self.master_resigned = false;
                    let at = now + master_down_interval(self.priority, interval);
                    self.set_timer(out, at);
                    out.actions.push(Action::ReleaseOwnership);
                    let reason = if priority > self.priority {
                        "higher priority master seen"
                    } else {
                        "equal priority master with higher address seen"
                    };
                    self.go(out, State::Backup, reason);
                } else {
                    // The RFC just discards this; answering at once makes the other master step
                    // down within one round trip instead of at its next advert.
                    out.split_brain = Some(SplitBrain {
                        peer: from,
                        peer_priority: priority,
                        stepped_down: false,
                    });
                    self.answer(now, out);
                }
            }
            State::Initialize | State::Fault => {}
        }
    }

    /// Whether a lower-priority master may be preempted now. With a preempt delay, the first
    /// lower-priority advert starts the count (keepalived's behaviour), so a node that returns
    /// to backup waits again, not only after start-up.
    fn may_preempt(&mut self, now: Time) -> bool {
        if !self.params.preempt {
            return false;
        }
        if self.params.preempt_delay.is_zero() {
            return true;
        }
        let at = *self
            .preempt_at
            .get_or_insert(now + self.params.preempt_delay);
        now >= at
    }

    /// Answer a conflicting advert with one of ours at once, unless we did so very recently.
    fn answer(&mut self, now: Time, out: &mut Output) {
        let gap = self.params.advert_interval / ANSWER_GAP;
        if self.last_sent.is_some_and(|t| now < t + gap) {
            return;
        }
        out.actions.push(Action::SendAdvert {
            priority: self.priority,
        });
        self.set_timer(out, now + self.params.advert_interval);
    }

    fn start(&mut self, now: Time, out: &mut Output, reason: &'static str) {
        self.master_resigned = false;
        if self.priority == OWNER_PRIORITY {
            self.become_master(now, out, reason);
        } else {
            self.master_interval = self.params.advert_interval;
            self.master_addr = None;
            let at = now + master_down_interval(self.priority, self.master_interval);
            self.set_timer(out, at);
            self.go(out, State::Backup, reason);
        }
    }

    fn become_master(&mut self, now: Time, out: &mut Output, reason: &'static str) {
        out.actions.push(Action::SendAdvert {
            priority: self.priority,
        });
        out.actions.push(Action::TakeOwnership);
        self.master_interval = self.params.advert_interval;
        self.master_addr = Some(self.params.primary_addr);
        self.master_resigned = false;
        self.set_timer(out, now + self.params.advert_interval);
        self.go(out, State::Master, reason);
    }

    fn set_timer(&mut self, out: &mut Output, at: Time) {
        self.timer = Some(at);
        out.actions.push(Action::SetTimer(at));
    }

    fn cancel_timer(&mut self, out: &mut Output) {
        self.timer = None;
        out.actions.push(Action::CancelTimer);
    }

    fn go(&mut self, out: &mut Output, to: State, reason: &'static str) {
        if to != State::Master && to != State::Backup {
            self.master_addr = None;
        }
        out.transition = Some(Transition {
            from: self.state,
            to,
            reason,
        });
        self.state = to;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn params(priority: u8) -> Params {
        Params {
            base_priority: priority,
            advert_interval: MS(1000),
            preempt: true,
            preempt_delay: Duration::ZERO,
            primary_addr: ip("192.0.2.10"),
        }
    }

    fn advert(from: &str, priority: u8) -> Event {
        Event::AdvertReceived {
            from: ip(from),
            priority,
            interval: MS(1000),
        }
    }

    fn started(priority: u8) -> Machine {
        let mut m = Machine::new(params(priority));
        m.handle(Duration::ZERO, Event::Startup);
        m
    }

    fn master(priority: u8) -> Machine {
        let mut m = started(priority);
        let t = m.timer().unwrap();
        m.handle(t, Event::TimerFired);
        assert_eq!(m.state(), State::Master);
        m
    }

    #[test]
    fn timer_arithmetic() {
        // OpenShift's keepalived: priority 40, 1 s adverts -> 3.84 s before a backup takes over.
        assert_eq!(
            skew_time(40, MS(1000)),
            MS(843) + Duration::from_micros(750)
        );
        assert_eq!(
            master_down_interval(100, MS(1000)),
            MS(3609) + Duration::from_micros(375)
        );
        assert_eq!(skew_time(255, MS(1000)), Duration::from_micros(3906));
        assert_eq!(
            master_down_interval(254, MS(100)),
            MS(300) + Duration::from_micros(781)
        );
        assert_eq!(effective_priority(40, 20 + 5 + 3), 68);
        assert_eq!(effective_priority(250, 50), 254);
        assert_eq!(effective_priority(10, -50), 1);
        assert_eq!(effective_priority(255, -50), 255);
    }

    #[test]
    fn startup_goes_backup_then_master_after_master_down_interval() {
        let mut m = Machine::new(params(100));
        let out = m.handle(MS(5), Event::Startup);
        let mdi = master_down_interval(100, MS(1000));
        assert_eq!(m.state(), State::Backup);
        assert_eq!(out.actions, vec![Action::SetTimer(MS(5) + mdi)]);
        assert_eq!(out.transition.unwrap().reason, "startup");
        // Early wake-ups do nothing.
        assert_eq!(
            m.handle(MS(5) + mdi - MS(1), Event::TimerFired),
            Output::default()
        );
        let out = m.handle(MS(5) + mdi, Event::TimerFired);
        assert_eq!(
            out.actions,
            vec![
                Action::SendAdvert { priority: 100 },
                Action::TakeOwnership,
                Action::SetTimer(MS(5) + mdi + MS(1000)),
            ]
        );
        let t = out.transition.unwrap();
        assert_eq!(
            (t.from, t.to, t.reason),
            (State::Backup, State::Master, "master down timer expired")
        );
        assert_eq!(m.master_addr(), Some(ip("192.0.2.10")));
    }

    #[test]
    fn owner_becomes_master_at_once() {
        let mut m = Machine::new(params(255));
        let out = m.handle(MS(0), Event::Startup);
        assert_eq!(m.state(), State::Master);
        assert_eq!(out.actions[0], Action::SendAdvert { priority: 255 });
        // Tracking cannot lower an owner.
        m.handle(MS(1), Event::PriorityChanged(10));
        assert_eq!(m.effective_priority(), 255);
    }

    #[test]
    fn master_sends_periodic_adverts() {
        let mut m = master(100);
        let t = m.timer().unwrap();
        let out = m.handle(t, Event::TimerFired);
        assert_eq!(
            out.actions,
            vec![
                Action::SendAdvert { priority: 100 },
                Action::SetTimer(t + MS(1000))
            ]
        );
        assert!(out.transition.is_none());
    }

    #[test]
    fn backup_resets_timer_on_higher_or_equal_advert_and_learns_interval() {
        let mut m = started(100);
        let out = m.handle(
            MS(500),
            Event::AdvertReceived {
                from: ip("192.0.2.20"),
                priority: 100,
                interval: MS(200),
            },
        );
        // RFC 9568: the backup uses the master's interval, with its own priority's skew.
        let want = MS(500) + master_down_interval(100, MS(200));
        assert_eq!(out.actions, vec![Action::SetTimer(want)]);
        assert_eq!(m.master_addr(), Some(ip("192.0.2.20")));
        assert_eq!(m.master_interval(), MS(200));
    }

    #[test]
    fn backup_with_preempt_ignores_lower_master_and_takes_over() {
        let mut m = started(150);
        let deadline = m.timer().unwrap();
        let out = m.handle(MS(100), advert("192.0.2.20", 100));
        assert!(out.actions.is_empty());
        assert_eq!(m.timer(), Some(deadline));
        let out = m.handle(deadline, Event::TimerFired);
        assert_eq!(m.state(), State::Master);
        assert!(out.actions.contains(&Action::TakeOwnership));
    }

    #[test]
    fn nopreempt_backup_follows_lower_master() {
        let mut m = Machine::new(Params {
            preempt: false,
            ..params(150)
        });
        m.handle(MS(0), Event::Startup);
        let out = m.handle(MS(100), advert("192.0.2.20", 100));
        assert_eq!(
            out.actions,
            vec![Action::SetTimer(
                MS(100) + master_down_interval(150, MS(1000))
            )]
        );
        assert_eq!(m.master_addr(), Some(ip("192.0.2.20")));
    }

    #[test]
    fn preempt_delay_counts_from_the_first_lower_priority_advert() {
        let mut m = Machine::new(Params {
            preempt_delay: MS(10_000),
            ..params(150)
        });
        m.handle(MS(0), Event::Startup);
        // The first lower-priority advert (3 s after start) starts the delay: until 13 s the
        // lower master is accepted (timer restarted).
        let out = m.handle(MS(3000), advert("192.0.2.20", 100));
        assert_eq!(out.actions.len(), 1);
        let out = m.handle(MS(12_999), advert("192.0.2.20", 100));
        assert_eq!(out.actions.len(), 1, "still within the delay");
        // After it, the lower master is ignored and we take over when the timer runs out.
        let deadline = m.timer().unwrap();
        let out = m.handle(MS(13_000), advert("192.0.2.20", 100));
        assert!(out.actions.is_empty());
        m.handle(deadline, Event::TimerFired);
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn preempt_delay_applies_again_after_returning_to_backup() {
        let mut m = Machine::new(Params {
            preempt_delay: MS(5000),
            ..params(150)
        });
        m.handle(MS(0), Event::Startup);
        // No master heard: we become master, then a higher one takes over.
        let t = m.timer().unwrap();
        m.handle(t, Event::TimerFired);
        assert_eq!(m.state(), State::Master);
        m.handle(MS(60_000), advert("192.0.2.30", 200));
        assert_eq!(m.state(), State::Backup);
        // Long after start-up, that master fails and a lower one takes over: we wait the full
        // delay again, counted from its first advert (61 s), before preempting it.
        let out = m.handle(MS(61_000), advert("192.0.2.20", 100));
        assert_eq!(
            out.actions.len(),
            1,
            "lower master accepted within the delay"
        );
        let out = m.handle(MS(65_999), advert("192.0.2.20", 100));
        assert_eq!(out.actions.len(), 1, "still within the delay");
        let out = m.handle(MS(66_000), advert("192.0.2.20", 100));
        assert!(
            out.actions.is_empty(),
            "delay over: the lower master is ignored"
        );
        // A master at least our priority restarts the count for the next lower one.
        m.handle(MS(66_100), advert("192.0.2.30", 200));
        let out = m.handle(MS(67_000), advert("192.0.2.20", 100));
        assert_eq!(out.actions.len(), 1, "a new delay started at 67 s");
        assert!(
            m.handle(MS(72_000), advert("192.0.2.20", 100))
                .actions
                .is_empty()
        );
    }

    #[test]
    fn answers_to_a_flood_of_conflicting_adverts_are_bounded() {
        let mut m = master(100);
        let mut sent = 0;
        // 1000 lower-priority master adverts within one second (1 ms apart).
        for i in 0..1000u64 {
            let out = m.handle(MS(4000 + i), advert("192.0.2.200", 99));
            sent += out
                .actions
                .iter()
                .filter(|a| matches!(a, Action::SendAdvert { .. }))
                .count();
            let out = m.handle(MS(4000 + i), advert("192.0.2.201", 0));
            sent += out
                .actions
                .iter()
                .filter(|a| matches!(a, Action::SendAdvert { .. }))
                .count();
        }
        assert_eq!(m.state(), State::Master);
        assert!(
            sent <= ANSWER_GAP as usize,
            "{sent} answers to 2000 adverts in one interval"
        );
        assert!(sent >= 1, "the first conflict is answered at once");
    }

    #[test]
    fn reconfigure_in_place_keeps_state_and_does_not_resign() {
        let mut m = master(100);
        let out = m.reconfigure(
            MS(4100),
            Params {
                base_priority: 120,
                ..params(120)
            },
            130,
        );
        assert_eq!(m.state(), State::Master);
        assert!(out.transition.is_none());
        assert!(!out.actions.iter().any(|a| matches!(
            a,
            Action::SendAdvert { priority: 0 } | Action::ReleaseOwnership
        )));
        assert_eq!(m.effective_priority(), 130);
        // A new interval takes effect at once: an advert now, the next one interval later.
        let out = m.reconfigure(
            MS(4200),
            Params {
                advert_interval: MS(200),
                ..params(120)
            },
            130,
        );
        assert_eq!(
            out.actions,
            vec![
                Action::SendAdvert { priority: 130 },
                Action::SetTimer(MS(4400))
            ]
        );
        assert_eq!(m.master_interval(), MS(200));
        // A backup just takes the new priority.
        let mut b = started(100);
        let out = b.reconfigure(MS(10), params(90), 90);
        assert_eq!(out, Output::default());
        assert_eq!((b.state(), b.effective_priority()), (State::Backup, 90));
    }

    #[test]
    fn priority_zero_advert_makes_backup_take_over_after_skew() {
        let mut m = started(100);
        m.handle(MS(100), advert("192.0.2.20", 200));
        let out = m.handle(MS(200), advert("192.0.2.20", 0));
        // The skew only, as keepalived: no extra interval.
        let at = MS(200) + skew_time(100, MS(1000));
        assert!(at < MS(200) + MS(1000));
        assert_eq!(out.actions, vec![Action::SetTimer(at)]);
        let out = m.handle(at, Event::TimerFired);
        assert_eq!(
            out.transition.unwrap().reason,
            "master resigned (priority 0 advert)"
        );
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn graceful_shutdown_of_master_sends_priority_zero_and_releases() {
        let mut m = master(100);
        let out = m.handle(MS(9000), Event::Shutdown);
        assert_eq!(
            out.actions,
            vec![
                Action::CancelTimer,
                Action::SendAdvert { priority: 0 },
                Action::ReleaseOwnership
            ]
        );
        assert_eq!(m.state(), State::Initialize);
        assert_eq!(m.master_addr(), None);
        // Shutting down twice is harmless.
        assert_eq!(m.handle(MS(9001), Event::Shutdown), Output::default());
    }

    #[test]
    fn shutdown_of_backup_is_silent() {
        let mut m = started(100);
        let out = m.handle(MS(1), Event::Shutdown);
        assert_eq!(out.actions, vec![Action::CancelTimer]);
        assert_eq!(m.state(), State::Initialize);
    }

    #[test]
    fn master_answers_priority_zero_with_an_advert() {
        let mut m = master(100);
        let out = m.handle(MS(4000), advert("192.0.2.20", 0));
        assert_eq!(
            out.actions,
            vec![
                Action::SendAdvert { priority: 100 },
                Action::SetTimer(MS(5000))
            ]
        );
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn split_brain_higher_priority_wins() {
        let mut m = master(100);
        let out = m.handle(MS(4000), advert("192.0.2.5", 101));
        assert_eq!(m.state(), State::Backup);
        assert!(out.actions.contains(&Action::ReleaseOwnership));
        assert_eq!(
            out.split_brain,
            Some(SplitBrain {
                peer: ip("192.0.2.5"),
                peer_priority: 101,
                stepped_down: true
            })
        );
        assert_eq!(
            out.transition.unwrap().reason,
            "higher priority master seen"
        );
        assert_eq!(m.master_addr(), Some(ip("192.0.2.5")));
        assert_eq!(
            m.timer(),
            Some(MS(4000) + master_down_interval(100, MS(1000)))
        );
    }

    #[test]
    fn split_brain_tie_break_on_address() {
        // Equal priority, higher address wins.
        let mut m = master(100);
        let out = m.handle(MS(4000), advert("192.0.2.11", 100));
        assert_eq!(m.state(), State::Backup);
        assert_eq!(
            out.transition.unwrap().reason,
            "equal priority master with higher address seen"
        );
        // Equal priority, lower address: we keep mastership and assert it at once.
        let mut m = master(100);
        let out = m.handle(MS(4000), advert("192.0.2.9", 100));
        assert_eq!(m.state(), State::Master);
        assert_eq!(
            out.actions,
            vec![
                Action::SendAdvert { priority: 100 },
                Action::SetTimer(MS(5000))
            ]
        );
        assert!(!out.split_brain.unwrap().stepped_down);
        assert!(out.transition.is_none());
    }

    #[test]
    fn split_brain_lower_priority_is_answered() {
        let mut m = master(100);
        let out = m.handle(MS(4000), advert("192.0.2.200", 99));
        assert_eq!(m.state(), State::Master);
        assert_eq!(out.actions[0], Action::SendAdvert { priority: 100 });
        assert!(!out.split_brain.unwrap().stepped_down);
    }

    #[test]
    fn own_adverts_are_ignored() {
        let mut m = master(100);
        assert_eq!(
            m.handle(MS(4000), advert("192.0.2.10", 200)),
            Output::default()
        );
        assert_eq!(m.state(), State::Master);
    }

    #[test]
    fn a_resignation_forged_in_our_name_is_answered_at_once() {
        // A master hears a priority-0 advert with its own address that it never sent: it
        // advertises at once (before the backups' skew runs out) and stays master.
        let mut m = master(100);
        let out = m.handle(MS(4000), advert("192.0.2.10", 0));
        assert_eq!(m.state(), State::Master);
        assert_eq!(out.actions[0], Action::SendAdvert { priority: 100 });
        // A backup ignores its own address whatever the priority.
        let mut b = started(100);
        assert_eq!(b.handle(MS(10), advert("192.0.2.10", 0)), Output::default());
        assert_eq!(b.state(), State::Backup);
    }

    #[test]
    fn interface_down_means_fault_and_up_restarts() {
        let mut m = master(100);
        let out = m.handle(MS(4000), Event::InterfaceDown);
        assert_eq!(
            out.actions,
            vec![Action::CancelTimer, Action::ReleaseOwnership]
        );
        assert_eq!(m.state(), State::Fault);
        // Adverts and timers are ignored while in fault.
        assert_eq!(
            m.handle(MS(4100), advert("192.0.2.20", 200)),
            Output::default()
        );
        assert_eq!(m.handle(MS(9000), Event::TimerFired), Output::default());
        let out = m.handle(MS(5000), Event::InterfaceUp);
        assert_eq!(m.state(), State::Backup);
        assert_eq!(out.transition.unwrap().reason, "interface up");
        assert_eq!(
            out.actions,
            vec![Action::SetTimer(
                MS(5000) + master_down_interval(100, MS(1000))
            )]
        );
    }

    #[test]
    fn startup_with_interface_down_waits_in_fault() {
        let mut m = Machine::new(params(100));
        assert_eq!(m.handle(MS(0), Event::InterfaceDown), Output::default());
        let out = m.handle(MS(1), Event::Startup);
        assert_eq!(m.state(), State::Fault);
        assert_eq!(out.transition.unwrap().reason, "interface down at startup");
        // InterfaceUp before Startup would not start anything; after it, it does.
        m.handle(MS(2), Event::InterfaceUp);
        assert_eq!(m.state(), State::Backup);
        // Interface flapping in Initialize does not start the machine.
        let mut m = Machine::new(params(100));
        m.handle(MS(0), Event::InterfaceUp);
        assert_eq!(m.state(), State::Initialize);
    }

    #[test]
    fn priority_changes_drive_preemption() {
        // Backup at 100 follows a master at 120; tracking raises us to 130: its next advert is
        // ignored and we take over.
        let mut m = started(100);
        m.handle(MS(100), advert("192.0.2.20", 120));
        m.handle(MS(200), Event::PriorityChanged(130));
        assert_eq!(m.effective_priority(), 130);
        let deadline = m.timer().unwrap();
        assert!(
            m.handle(MS(1100), advert("192.0.2.20", 120))
                .actions
                .is_empty()
        );
        m.handle(deadline, Event::TimerFired);
        assert_eq!(m.state(), State::Master);
        // The master's adverts carry the new effective priority.
        m.handle(MS(5000), Event::PriorityChanged(90));
        let t = m.timer().unwrap();
        let out = m.handle(t, Event::TimerFired);
        assert_eq!(out.actions[0], Action::SendAdvert { priority: 90 });
        // Tracking cannot reach 0 or 255.
        m.handle(MS(6000), Event::PriorityChanged(0));
        assert_eq!(m.effective_priority(), 1);
        m.handle(MS(6000), Event::PriorityChanged(255));
        assert_eq!(m.effective_priority(), 254);
    }

    #[test]
    fn highest_priority_backup_wins_after_resignation() {
        // Three routers: master M resigns; backups at 200 and 100 both start skew timers and
        // the 200 one fires first.
        let mut hi = started(200);
        let mut lo = Machine::new(Params {
            primary_addr: ip("192.0.2.11"),
            ..params(100)
        });
        lo.handle(MS(0), Event::Startup);
        for m in [&mut hi, &mut lo] {
            m.handle(MS(100), advert("192.0.2.1", 250));
            m.handle(MS(200), advert("192.0.2.1", 0));
        }
        let (t_hi, t_lo) = (hi.timer().unwrap(), lo.timer().unwrap());
        assert!(t_hi < t_lo);
        let out = hi.handle(t_hi, Event::TimerFired);
        assert_eq!(hi.state(), State::Master);
        // The new master's advert reaches the other backup before its timer runs out.
        assert_eq!(out.actions[0], Action::SendAdvert { priority: 200 });
        lo.handle(t_hi, advert("192.0.2.10", 200));
        assert_eq!(lo.handle(t_lo, Event::TimerFired), Output::default());
        assert_eq!(lo.state(), State::Backup);
    }

    #[test]
    fn a_resignation_counts_only_from_our_master() {
        let mut m = started(100);
        m.handle(MS(100), advert("192.0.2.20", 100));
        let before = m.timer();
        // A priority-0 advert from a host that is not our master changes nothing.
        assert_eq!(
            m.handle(MS(200), advert("192.0.2.99", 0)),
            Output::default()
        );
        assert_eq!(m.timer(), before);
        assert_eq!(m.state(), State::Backup);
    }

    #[test]
    fn a_failing_weight_zero_check_is_fault_until_it_passes() {
        // Master resigns (priority 0 advert) and releases.
        let mut m = master(100);
        let out = m.handle(MS(4000), Event::TrackFault(true));
        assert_eq!(
            out.actions,
            vec![
                Action::CancelTimer,
                Action::SendAdvert { priority: 0 },
                Action::ReleaseOwnership
            ]
        );
        assert_eq!(m.state(), State::Fault);
        // In fault: no elections, even when the link comes and goes.
        assert_eq!(
            m.handle(MS(4100), advert("192.0.2.20", 50)),
            Output::default()
        );
        m.handle(MS(4200), Event::InterfaceDown);
        m.handle(MS(4300), Event::InterfaceUp);
        assert_eq!(m.state(), State::Fault);
        let out = m.handle(MS(5000), Event::TrackFault(false));
        assert_eq!(m.state(), State::Backup);
        assert_eq!(
            out.transition.unwrap().reason,
            "tracked check passing again"
        );
        // A backup goes to fault silently; with the link down too, passing again waits for it.
        let mut b = started(100);
        let out = b.handle(MS(10), Event::TrackFault(true));
        assert!(
            !out.actions
                .iter()
                .any(|a| matches!(a, Action::SendAdvert { .. }))
        );
        assert_eq!(b.state(), State::Fault);
        b.handle(MS(20), Event::InterfaceDown);
        b.handle(MS(30), Event::TrackFault(false));
        assert_eq!(b.state(), State::Fault);
        b.handle(MS(40), Event::InterfaceUp);
        assert_eq!(b.state(), State::Backup);
        // Failing before start-up: start in fault.
        let mut f = Machine::new(params(100));
        f.handle(MS(0), Event::TrackFault(true));
        f.handle(MS(1), Event::Startup);
        assert_eq!(f.state(), State::Fault);
    }

    #[test]
    fn preempting_a_live_lower_master_is_not_a_master_failure() {
        let mut m = started(200);
        // A lower-priority master keeps advertising; we may preempt, so our timer runs out.
        m.handle(MS(100), advert("192.0.2.20", 100));
        let mut t = MS(100);
        while m.state() == State::Backup && t < MS(10_000) {
            t += MS(1000);
            m.handle(t, advert("192.0.2.20", 100));
            if let Some(timer) = m.timer()
                && timer <= t + MS(1000)
            {
                let out = m.handle(timer, Event::TimerFired);
                if let Some(tr) = out.transition {
                    assert_eq!(tr.reason, REASON_PREEMPT);
                }
            }
        }
        assert_eq!(m.state(), State::Master);
        // A master that went silent is a failure.
        let mut b = started(100);
        b.handle(MS(100), advert("192.0.2.20", 200));
        let at = b.timer().unwrap();
        let out = b.handle(at, Event::TimerFired);
        assert_eq!(out.transition.unwrap().reason, REASON_MASTER_DOWN);
    }
}
