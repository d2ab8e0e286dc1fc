//! The hold/announce machine: beside the RFC machine ([`super::state`]), what a VRRP instance
//! does with its VIPs once mastership changes. A new master reports the master that went silent
//! (fate sharing, before anything else), asks the data plane to forward, waits for its
//! acknowledgement (at most [`FORWARDING_ACK_WAIT`]), then holds the VIPs (adds them to the
//! interface) and announces them in bursts; it gives them back when mastership ends. A failed
//! add or removal is retried at each link poll.
//!
//! [`Hold::handle`] takes the time as a value and returns [`Effect`]s in the order the shell must
//! carry them out (the instance task in `lb-userspace`'s `vrrp/instance.rs`). The results of
//! effects that do I/O come back as inputs ([`Input::VipsAdded`], [`Input::VipsRemoved`]).

use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Announcements right after holding the VIPs, and their spacing: several, because a single
/// frame can be lost and switches may still be learning.
pub const GARP_BURST: u32 = 5;
pub const GARP_SPACING: Duration = Duration::from_millis(100);
/// Longest a new master waits for the data plane to forward before adding and announcing its
/// VIPs anyway. Announcing early is what resets connections (clients that follow the
/// announcement reach the local stack, which holds the VIP on `lo` and answers every flow of
/// another backend with a reset), so the wait is long enough for a daemon on a CPU-saturated
/// node; the instance keeps advertising and hearing adverts meanwhile.
pub const FORWARDING_ACK_WAIT: Duration = Duration::from_secs(3);

/// The announcement settings of an instance (keepalived's `garp_master_delay` and
/// `garp_master_refresh`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// A second burst this long after the first; 0: none.
    pub delay_s: u64,
    /// Then one round this often; 0: none.
    pub refresh_s: u64,
}

/// What happened, as the shell saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// The RFC machine made this node master (its `TakeOwnership` action). `dead_master`: the
    /// master whose silence caused it (the master-down timer, not a resignation or preemption);
    /// `acks`: the data plane confirms forwarding (the daemon listens); `forwarding`: it
    /// forwards already.
    Mastership {
        dead_master: Option<IpAddr>,
        acks: bool,
        forwarding: bool,
    },
    /// The RFC machine left master (its `ReleaseOwnership` action).
    Released,
    /// The data plane's forwarding acknowledgement changed.
    Forwarding(bool),
    /// Nobody acknowledges forwarding any more (lbd stopping, or a reload replacing this
    /// instance).
    ForwardingGone,
    /// Time passed (the shell calls at [`Hold::next_wake`]).
    Tick,
    /// Another master's advert conflicted and this node stayed master: the other announced the
    /// VIPs too.
    ConflictKept,
    /// The interface's MAC changed: clients must learn the new one.
    MacChanged,
    /// A reload changed the announcement settings.
    Reconfigured(Schedule),
    /// The result of [`Effect::AddVips`]: `ok` when every VIP is on the interface.
    VipsAdded { ok: bool },
    /// The result of [`Effect::RemoveVips`].
    VipsRemoved { ok: bool },
    /// The link poll: a time to retry a failed add or removal.
    LinkPoll,
}

/// What the shell does, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Tell the daemon that `peer`, the master until now, died (before [`Effect::Own`]: its
    /// backends leave the tables before this node forwards).
    ReportDeadMaster(IpAddr),
    /// Tell the daemon whether this node owns the VIPs (it forwards, through the handover
    /// grace, while it does).
    Own(bool),
    /// Add the VIPs to the interface; answer with [`Input::VipsAdded`].
    AddVips,
    /// Remove the VIPs from the interface; answer with [`Input::VipsRemoved`].
    RemoveVips,
    /// Whether the VIPs are held (the status' `owned`).
    Held(bool),
    /// Send one round of gratuitous ARP / unsolicited NA for the VIPs.
    Announce,
    /// The data plane forwards after `waited`: holding and announcing now.
    ForwardingConfirmed { waited: Duration },
    /// The data plane did not confirm within [`FORWARDING_ACK_WAIT`]: holding anyway.
    ForwardingLate,
    /// The VIPs are on the interface after an earlier add failed.
    AddRecovered,
}

/// The hold/announce state of one instance.
#[derive(Clone, Debug, Default)]
pub struct Hold {
    schedule: Schedule,
    /// Between `Mastership` and `Released`.
    master: bool,
    /// Master, waiting since then for the data plane to forward before holding the VIPs.
    awaiting_forwarding: Option<Instant>,
    /// Rounds left in the current burst.
    garp_left: u32,
    /// The second burst (`delay_s`) is still to come.
    second_burst: bool,
    next_garp: Option<Instant>,
    /// A VIP add failed while master, retried at the next link poll (the master advertises on,
    /// so nobody else takes the VIP).
    add_pending: bool,
    /// A VIP removal failed, retried at the next link poll, so a backup never keeps a VIP.
    remove_pending: bool,
}

impl Hold {
    pub fn new(schedule: Schedule) -> Self {
        Hold {
            schedule,
            ..Default::default()
        }
    }

    /// Waiting for the data plane's acknowledgement (the shell listens for it meanwhile).
    pub fn awaiting_forwarding(&self) -> bool {
        self.awaiting_forwarding.is_some()
    }

    /// When to send [`Input::Tick`] next; `None`: nothing is due.
    pub fn next_wake(&self) -> Option<Instant> {
        match self.awaiting_forwarding {
            // No announcement of VIPs not held yet (a split brain or a MAC change while
            // waiting for the data plane): holding them starts a burst anyway.
            Some(t) => Some(t + FORWARDING_ACK_WAIT),
            None => self.next_garp,
        }
    }

    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::Mastership {
                dead_master,
                acks,
                forwarding,
            } => {
                // A dead master first, then forwarding, then the addresses and their
                // announcement: a client that follows the GARP/NA must find a data plane that
                // forwards its flows, not the local stack. The wait runs in the shell's loop:
                // a master that stopped advertising while its daemon is slow would be taken
                // over by the backups.
                out.extend(dead_master.map(Effect::ReportDeadMaster));
                out.push(Effect::Own(true));
                self.master = true;
                if acks && !forwarding {
                    self.awaiting_forwarding = Some(now);
                } else {
                    self.hold(now, &mut out);
                }
            }
            Input::Released => {
                // Stop forwarding first, then give the addresses back.
                self.master = false;
                self.add_pending = false;
                self.awaiting_forwarding = None;
                self.garp_left = 0;
                self.second_burst = false;
                self.next_garp = None;
                out.extend([Effect::Own(false), Effect::Held(false), Effect::RemoveVips]);
            }
            Input::Forwarding(true) => {
                if let Some(since) = self.awaiting_forwarding {
                    out.push(Effect::ForwardingConfirmed {
                        waited: now.saturating_duration_since(since),
                    });
                    self.hold(now, &mut out);
                }
            }
            Input::Forwarding(false) => {}
            // Nothing will forward these VIPs here, so they are not taken.
            Input::ForwardingGone => self.awaiting_forwarding = None,
            Input::Tick => match self.awaiting_forwarding {
                Some(since) if now >= since + FORWARDING_ACK_WAIT => {
                    out.push(Effect::ForwardingLate);
                    self.hold(now, &mut out);
                }
                Some(_) => {}
                None => {
                    if self.next_garp.is_some_and(|t| t <= now) {
                        out.push(Effect::Announce);
                        let next = after_announce(
                            self.garp_left,
                            self.second_burst,
                            self.schedule.delay_s,
                            self.schedule.refresh_s,
                        );
                        (self.garp_left, self.second_burst) = (next.left, next.second_burst);
                        self.next_garp = next.wait.map(|d| now + d);
                    }
                }
            },
            // A fresh burst, unless one runs already.
            Input::ConflictKept => {
                if self.master && self.garp_left == 0 {
                    self.garp_left = GARP_BURST;
                    self.next_garp = Some(now);
                }
            }
            Input::MacChanged => {
                if self.master {
                    self.garp_left = GARP_BURST;
                    self.next_garp = Some(now);
                }
            }
            Input::Reconfigured(s) => {
                if s.refresh_s != self.schedule.refresh_s && self.garp_left == 0 {
                    self.next_garp = (self.master && s.refresh_s > 0)
                        .then(|| now + Duration::from_secs(s.refresh_s));
                }
                self.schedule = s;
            }
            Input::VipsAdded { ok } => {
                if self.add_pending && ok {
                    out.push(Effect::AddRecovered);
                }
                self.add_pending = !ok;
            }
            Input::VipsRemoved { ok } => self.remove_pending = !ok,
            Input::LinkPoll => {
                if self.remove_pending && !self.master {
                    out.push(Effect::RemoveVips);
                }
                if self.add_pending && self.master {
                    out.push(Effect::AddVips);
                }
            }
        }
        out
    }

    /// Add the VIPs and start announcing them.
    fn hold(&mut self, now: Instant, out: &mut Vec<Effect>) {
        self.awaiting_forwarding = None;
        out.extend([Effect::AddVips, Effect::Held(true)]);
        self.garp_left = GARP_BURST;
        self.second_burst = true;
        self.next_garp = Some(now);
    }
}

/// What follows one round of announcements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AfterAnnounce {
    /// Rounds left in the current burst.
    left: u32,
    second_burst: bool,
    /// When the next round is due; `None`: no more until the next change.
    wait: Option<Duration>,
}

/// After one round with `left` rounds of the burst to go (this one included): the rest of the
/// burst, [`GARP_SPACING`] apart; then, once, a second burst `delay_s` later (keepalived's
/// `garp_master_delay`); then a round every `refresh_s`.
fn after_announce(left: u32, second_burst: bool, delay_s: u64, refresh_s: u64) -> AfterAnnounce {
    let left = left.saturating_sub(1);
    if left > 0 {
        return AfterAnnounce {
            left,
            second_burst,
            wait: Some(GARP_SPACING),
        };
    }
    if second_burst && delay_s > 0 {
        return AfterAnnounce {
            left: GARP_BURST,
            second_burst: false,
            wait: Some(Duration::from_secs(delay_s)),
        };
    }
    AfterAnnounce {
        left: 0,
        second_burst: false,
        wait: (refresh_s > 0).then(|| Duration::from_secs(refresh_s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEAD: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn master(dead_master: Option<IpAddr>, acks: bool) -> Input {
        Input::Mastership {
            dead_master,
            acks,
            forwarding: false,
        }
    }

    /// Replays `inputs` (at offsets from `t0`) and returns every effect with its offset.
    fn replay(h: &mut Hold, t0: Instant, inputs: &[(u64, Input)]) -> Vec<(u64, Effect)> {
        inputs
            .iter()
            .flat_map(|&(at, i)| {
                h.handle(t0 + ms(at), i)
                    .into_iter()
                    .map(move |e| (at, e))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Ticks at every wake until `until` (offset), returning the offsets of announcements.
    fn announcements(h: &mut Hold, t0: Instant, until: u64) -> Vec<u64> {
        let mut at = Vec::new();
        while let Some(w) = h.next_wake().filter(|w| *w <= t0 + ms(until)) {
            if h.handle(w, Input::Tick).contains(&Effect::Announce) {
                at.push(w.duration_since(t0).as_millis() as u64);
            }
        }
        at
    }

    #[test]
    fn a_dead_master_is_reported_before_the_mastership_it_caused() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule::default());
        let out = h.handle(t0, master(Some(DEAD), true));
        assert_eq!(out, vec![Effect::ReportDeadMaster(DEAD), Effect::Own(true)]);
        // A preemption or a resignation reports nobody.
        let mut h = Hold::new(Schedule::default());
        assert_eq!(h.handle(t0, master(None, false))[0], Effect::Own(true));
    }

    #[test]
    fn the_vips_are_held_only_once_the_data_plane_forwards() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule::default());
        let out = replay(
            &mut h,
            t0,
            &[
                (0, master(None, true)),
                // Not announced while waiting, whatever asks for a burst.
                (10, Input::MacChanged),
                (20, Input::Tick),
                (30, Input::Forwarding(false)),
                (250, Input::Forwarding(true)),
            ],
        );
        assert_eq!(
            out,
            vec![
                (0, Effect::Own(true)),
                (250, Effect::ForwardingConfirmed { waited: ms(250) }),
                (250, Effect::AddVips),
                (250, Effect::Held(true)),
            ]
        );
        assert!(!h.awaiting_forwarding());
        // The burst starts at once.
        assert_eq!(
            announcements(&mut h, t0, 1000),
            vec![250, 350, 450, 550, 650]
        );
        // A late acknowledgement changes nothing.
        assert!(h.handle(t0 + ms(2000), Input::Forwarding(true)).is_empty());
    }

    #[test]
    fn a_data_plane_slow_to_forward_gets_the_vips_held_after_the_wait() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule::default());
        h.handle(t0, master(None, true));
        let wait = FORWARDING_ACK_WAIT.as_millis() as u64;
        assert_eq!(h.next_wake(), Some(t0 + FORWARDING_ACK_WAIT));
        assert!(h.handle(t0 + ms(wait - 1), Input::Tick).is_empty());
        assert_eq!(
            h.handle(t0 + ms(wait), Input::Tick),
            vec![Effect::ForwardingLate, Effect::AddVips, Effect::Held(true)]
        );
        assert_eq!(h.next_wake(), Some(t0 + ms(wait)));
    }

    #[test]
    fn without_acknowledgements_or_when_forwarding_already_the_vips_are_held_at_once() {
        let t0 = Instant::now();
        for (acks, forwarding) in [(false, false), (true, true)] {
            let mut h = Hold::new(Schedule::default());
            let input = Input::Mastership {
                dead_master: None,
                acks,
                forwarding,
            };
            assert_eq!(
                h.handle(t0, input),
                vec![Effect::Own(true), Effect::AddVips, Effect::Held(true)]
            );
        }
    }

    #[test]
    fn a_master_that_stops_being_acknowledged_never_takes_the_vips() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule::default());
        h.handle(t0, master(None, true));
        h.handle(t0 + ms(5), Input::ForwardingGone);
        assert_eq!(h.next_wake(), None);
        assert!(h.handle(t0 + ms(10_000), Input::Tick).is_empty());
        assert!(
            h.handle(t0 + ms(10_001), Input::Forwarding(true))
                .is_empty()
        );
    }

    #[test]
    fn leaving_master_stops_forwarding_first_and_ends_the_announcements() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule {
            delay_s: 5,
            refresh_s: 60,
        });
        h.handle(t0, master(None, false));
        assert_eq!(announcements(&mut h, t0, 150), vec![0, 100]);
        assert_eq!(
            h.handle(t0 + ms(160), Input::Released),
            vec![Effect::Own(false), Effect::Held(false), Effect::RemoveVips]
        );
        assert_eq!(h.next_wake(), None);
        // Released while waiting for the data plane: no late hold.
        h.handle(t0 + ms(200), master(None, true));
        h.handle(t0 + ms(300), Input::Released);
        assert!(
            h.handle(t0 + ms(300) + FORWARDING_ACK_WAIT, Input::Tick)
                .is_empty()
        );
    }

    #[test]
    fn a_second_burst_follows_after_the_delay_then_the_refresh() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule {
            delay_s: 5,
            refresh_s: 60,
        });
        h.handle(t0, master(None, false));
        assert_eq!(
            announcements(&mut h, t0, 130_000),
            vec![
                0, 100, 200, 300, 400, 5400, 5500, 5600, 5700, 5800, 65_800, 125_800
            ]
        );
        // No second burst with delay 0, nothing after the burst without a refresh.
        let mut h = Hold::new(Schedule::default());
        h.handle(t0, master(None, false));
        assert_eq!(
            announcements(&mut h, t0, 100_000),
            vec![0, 100, 200, 300, 400]
        );
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn a_conflict_or_a_new_mac_starts_a_fresh_burst_but_not_on_top_of_one() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule {
            delay_s: 0,
            refresh_s: 60,
        });
        h.handle(t0, master(None, false));
        // In the burst: a conflict adds nothing.
        h.handle(t0 + ms(50), Input::ConflictKept);
        assert_eq!(announcements(&mut h, t0, 1000), vec![0, 100, 200, 300, 400]);
        h.handle(t0 + ms(2000), Input::ConflictKept);
        assert_eq!(
            announcements(&mut h, t0, 2500),
            vec![2000, 2100, 2200, 2300, 2400]
        );
        // A new MAC restarts the burst even inside one.
        h.handle(t0 + ms(3000), Input::MacChanged);
        h.handle(t0 + ms(3000), Input::Tick);
        h.handle(t0 + ms(3050), Input::MacChanged);
        assert_eq!(
            announcements(&mut h, t0, 3600),
            vec![3050, 3150, 3250, 3350, 3450]
        );
        // A backup announces nothing.
        let mut b = Hold::new(Schedule::default());
        b.handle(t0, Input::ConflictKept);
        b.handle(t0, Input::MacChanged);
        assert_eq!(b.next_wake(), None);
    }

    #[test]
    fn a_new_refresh_applies_from_the_reload_when_no_burst_runs() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule {
            delay_s: 0,
            refresh_s: 60,
        });
        h.handle(t0, master(None, false));
        announcements(&mut h, t0, 1000);
        h.handle(
            t0 + ms(10_000),
            Input::Reconfigured(Schedule {
                delay_s: 0,
                refresh_s: 5,
            }),
        );
        assert_eq!(announcements(&mut h, t0, 21_000), vec![15_000, 20_000]);
        h.handle(t0 + ms(21_000), Input::Reconfigured(Schedule::default()));
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn failed_adds_and_removals_are_retried_at_the_link_poll_in_the_right_state() {
        let t0 = Instant::now();
        let mut h = Hold::new(Schedule::default());
        h.handle(t0, master(None, false));
        assert!(h.handle(t0, Input::VipsAdded { ok: false }).is_empty());
        assert_eq!(
            h.handle(t0 + ms(250), Input::LinkPoll),
            vec![Effect::AddVips]
        );
        assert_eq!(
            h.handle(t0 + ms(250), Input::VipsAdded { ok: true }),
            vec![Effect::AddRecovered]
        );
        assert!(h.handle(t0 + ms(500), Input::LinkPoll).is_empty());
        // Left master: a pending add is dropped, a failed removal retried until done.
        h.handle(t0 + ms(600), Input::VipsAdded { ok: false });
        h.handle(t0 + ms(700), Input::Released);
        h.handle(t0 + ms(700), Input::VipsRemoved { ok: false });
        assert_eq!(
            h.handle(t0 + ms(750), Input::LinkPoll),
            vec![Effect::RemoveVips]
        );
        h.handle(t0 + ms(750), Input::VipsRemoved { ok: true });
        assert!(h.handle(t0 + ms(1000), Input::LinkPoll).is_empty());
        // A removal pending while master again waits for the next release.
        h.handle(t0 + ms(1100), Input::VipsRemoved { ok: false });
        h.handle(t0 + ms(1200), master(None, false));
        assert_eq!(h.handle(t0 + ms(1250), Input::LinkPoll), vec![]);
    }
}
