//! Replays of event sequences through the daemon's controller (`lb_core::controller`): what the
//! owner would carry out, in order, and the facts the plan would read at each apply.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lb_core::backends::{Check, HealthFact, HealthFacts, Pair};
use lb_core::controller::{Adopted, Controller, Effect, Input};

const HOLD: Duration = Duration::from_secs(30);

fn pair(a: &str) -> Pair {
    ("api".into(), a.parse().unwrap())
}

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn check(a: &str, healthy: bool, previous: Option<bool>) -> Input {
    Input::Health(Check {
        pair: pair(a),
        healthy,
        reason: if healthy { "ok" } else { "timeout" }.into(),
        previous,
        hard: false,
        refused: false,
    })
}

fn up(addrs: &[&str]) -> HealthFacts {
    addrs
        .iter()
        .map(|a| {
            (
                pair(a),
                HealthFact {
                    healthy: true,
                    reason: "ok".into(),
                    ..Default::default()
                },
            )
        })
        .collect()
}

fn started(c: &mut Controller, t: Instant, name: &str) -> (u64, Duration) {
    let out = c.handle(
        t,
        Input::InstanceStarted {
            name: name.into(),
            priority: 100,
            interval: s(1),
        },
    );
    match out.as_slice() {
        [Effect::WatchOwnership { name: n, id, hold }] if n == name => (*id, *hold),
        other => panic!("{other:?}"),
    }
}

/// Carry out the effects as a shell that succeeds at every step would: what it was asked, in
/// order, with the results fed back.
fn run(c: &mut Controller, t: Instant, input: Input, fail: &[&str]) -> Vec<Effect> {
    let mut done = Vec::new();
    let mut queue: std::collections::VecDeque<Effect> = c.handle(t, input).into();
    while let Some(e) = queue.pop_front() {
        let result = match &e {
            Effect::Apply => Some(Input::Applied {
                error: fail.contains(&"apply").then(|| "limits".to_string()),
            }),
            Effect::SetStaticVips => Some(Input::StaticVipsSet {
                error: fail.contains(&"static").then(|| "EPERM".to_string()),
            }),
            Effect::ReconcileVrrp => Some(Input::VrrpReconciled {
                error: fail.contains(&"vrrp").then(|| "no interface".to_string()),
            }),
            _ => None,
        };
        done.push(e);
        if let Some(i) = result {
            queue.extend(c.handle(t, i));
        }
    }
    done
}

#[test]
fn a_dead_masters_backends_are_out_before_this_node_forwards() {
    let t0 = Instant::now();
    let mut c = Controller::new(
        Adopted {
            health: up(&["10.0.0.1", "10.0.0.2"]),
            ..Default::default()
        },
        HOLD,
    );
    let (id, hold) = started(&mut c, t0, "api");
    assert_eq!(hold, Duration::ZERO, "nothing adopted: no hold");
    // The instance reports the dead master first, then its mastership.
    let out = c.handle(
        t0 + s(4),
        Input::DeadMaster {
            instance: "api".into(),
            peer: "10.0.0.2".parse().unwrap(),
            pairs: vec![pair("10.0.0.2")],
        },
    );
    assert!(
        matches!(&out[..2], [Effect::ForceDown { ids, .. }, Effect::Apply] if ids == &["api/10.0.0.2"]),
        "{out:?}"
    );
    assert!(!c.health()[&pair("10.0.0.2")].healthy);
    assert!(c.health()[&pair("10.0.0.2")].hard);
    assert!(!c.forwarding(), "not forwarding before the mastership");
    let out = c.handle(
        t0 + s(4),
        Input::Ownership {
            name: "api".into(),
            id,
            forward: true,
        },
    );
    // Tracks first (a group follows), the rebuild, then the answer the announcement waits for.
    assert_eq!(
        out,
        [
            Effect::PushTracks,
            Effect::Apply,
            Effect::AckOwnership,
            Effect::PushTracks,
            Effect::SyncBgp,
            Effect::SyncView
        ]
    );
    // The facts of that apply: forwarding, the dead master's backend out, the other in.
    assert!(c.forwarding());
    assert!(!c.health()[&pair("10.0.0.2")].healthy);
    assert!(c.health()[&pair("10.0.0.1")].healthy);
    // A message of a replaced incarnation changes nothing, and is answered.
    let (_, _) = started(&mut c, t0 + s(5), "api");
    let out = c.handle(
        t0 + s(5),
        Input::Ownership {
            name: "api".into(),
            id,
            forward: false,
        },
    );
    assert_eq!(out, [Effect::AckOwnership]);
    assert!(c.forwarding());
}

#[test]
fn a_failed_backend_keeps_its_flows_until_the_hold_expires_at_a_tick() {
    let t0 = Instant::now();
    let mut c = Controller::new(
        Adopted {
            health: up(&["10.0.0.1"]),
            ..Default::default()
        },
        HOLD,
    );
    let out = c.handle(t0 + s(1), check("10.0.0.1", false, Some(true)));
    assert_eq!(out[0], Effect::Apply);
    assert_eq!(c.health()[&pair("10.0.0.1")].hold_until, Some(t0 + s(31)));
    // Ticks inside the hold rebuild nothing (no slow start either).
    let out = c.handle(t0 + s(30), Input::Tick { ramping: false });
    assert!(!out.contains(&Effect::Apply), "{out:?}");
    assert_eq!(out.first(), Some(&Effect::SyncView));
    // The tick at its end does, once: the hold is over, its flows move.
    let out = c.handle(t0 + s(31), Input::Tick { ramping: false });
    assert_eq!(out.first(), Some(&Effect::Apply));
    assert_eq!(c.health()[&pair("10.0.0.1")].hold_until, None);
    let out = c.handle(t0 + s(32), Input::Tick { ramping: false });
    assert!(!out.contains(&Effect::Apply), "{out:?}");
    // A gather that found nothing new does not rebuild once the maps are in sync. (The ticks
    // asked for gathers while the first ran: one more starts when it ends.)
    c.handle(t0 + s(32), Input::Applied { error: None });
    let out = c.handle(
        t0 + s(33),
        Input::Gathered {
            changed: Some(false),
        },
    );
    assert_eq!(out, [Effect::StartGather, Effect::SyncBgp]);
    // One that did, or with the maps out of sync, does.
    let out = c.handle(
        t0 + s(33),
        Input::Gathered {
            changed: Some(true),
        },
    );
    assert_eq!(out, [Effect::Apply, Effect::SyncBgp]);
    c.handle(
        t0 + s(33),
        Input::Applied {
            error: Some("limits".into()),
        },
    );
    let out = c.handle(
        t0 + s(33),
        Input::Gathered {
            changed: Some(false),
        },
    );
    assert_eq!(out, [Effect::Apply, Effect::SyncBgp]);
    // One gather at a time: a request while one runs starts the next when it ends.
    assert_eq!(c.handle(t0, Input::GatherWanted), [Effect::StartGather]);
    assert!(c.handle(t0, Input::GatherWanted).is_empty());
    let out = c.handle(t0, Input::Gathered { changed: None });
    assert_eq!(out, [Effect::StartGather]);
}

#[test]
fn a_reload_whose_static_vips_fail_is_undone_with_the_running_health_facts() {
    let t0 = Instant::now();
    let mut c = Controller::new(
        Adopted {
            health: up(&["10.0.0.1"]),
            ..Default::default()
        },
        HOLD,
    );
    // The new config knows another backend, not checked yet, and a shorter hold.
    let mut fresh = up(&["10.0.0.1"]);
    fresh.insert(pair("10.0.0.9"), HealthFact::default());
    let staged = Input::ReloadStaged {
        fresh: fresh.clone(),
        hold: s(5),
    };
    let out = run(&mut c, t0, staged.clone(), &["static"]);
    assert_eq!(
        out,
        [
            Effect::InstallConfig,
            Effect::Apply,
            Effect::SetStaticVips,
            Effect::RestoreConfig,
            Effect::Apply,
            Effect::SetStaticVips,
            Effect::ReloadDone(Err("static VIPs; kept the running config: EPERM".into())),
        ]
    );
    assert_eq!(c.health(), &up(&["10.0.0.1"]), "the running facts are back");
    assert_eq!(c.reloads().failed, 1);
    // The running hold is back too: a failure now holds 30 s, not 5.
    c.handle(t0 + s(1), check("10.0.0.1", false, Some(true)));
    assert_eq!(c.health()[&pair("10.0.0.1")].hold_until, Some(t0 + s(31)));
    // A data plane that refuses the new config: back without touching the static VIPs.
    let mut c = Controller::new(Default::default(), HOLD);
    let out = run(&mut c, t0, staged.clone(), &["apply"]);
    assert_eq!(
        out,
        [
            Effect::InstallConfig,
            Effect::Apply,
            Effect::RestoreConfig,
            Effect::Apply,
            Effect::ReloadDone(Err(
                "new config refused by the data plane; kept the running one: limits".into()
            )),
        ]
    );
    // Every step succeeding commits, with the new facts, and counts.
    let mut c = Controller::new(Default::default(), HOLD);
    let out = run(&mut c, t0, staged, &[]);
    assert_eq!(out.last(), Some(&Effect::ReloadDone(Ok(()))));
    assert!(out.contains(&Effect::CommitReload));
    assert!(!out.contains(&Effect::RestoreConfig));
    assert_eq!(c.health(), &fresh);
    assert_eq!((c.reloads().done, c.reloads().failed), (1, 0));
    // A refused file changes nothing and is counted.
    let out = run(
        &mut c,
        t0,
        Input::ReloadRefused {
            error: "vips[0].address: bad".into(),
        },
        &[],
    );
    assert_eq!(
        out,
        [Effect::ReloadDone(Err("vips[0].address: bad".into()))]
    );
    assert_eq!(
        c.reloads().last_error.as_deref(),
        Some("vips[0].address: bad")
    );
}

#[test]
fn a_restart_after_a_crash_mid_reload_forwards_with_the_adopted_state_for_the_hold() {
    // lbd crashed between the data plane's apply of a new config and its VRRP step: the next
    // lbd reads the new file and adopts what the maps hold (healthy pairs, drains, the VIPs
    // it forwarded).
    let t0 = Instant::now();
    let mut c = Controller::new(
        Adopted {
            health: up(&["10.0.0.1"]),
            drained: HashSet::from([pair("10.0.0.3")]),
            forwarding: HashSet::from(["api".to_string()]),
        },
        HOLD,
    );
    // Not ready until start-up is done; the maps keep forwarding what was adopted.
    assert_eq!(c.readiness(&[]), Err("starting".into()));
    assert!(c.forwarding());
    assert!(c.drained().contains(&pair("10.0.0.3")));
    c.handle(t0, Input::Started);
    assert_eq!(
        c.readiness(&[("api", None)]),
        Err("VRRP not started yet".into())
    );
    // The adopted instance's first incarnation holds forwarding for its master-down interval
    // and a second; another instance, and a later incarnation, do not.
    let (id, hold) = started(&mut c, t0, "api");
    assert_eq!(
        hold,
        lb_core::handover::adopted_hold(100, s(1)),
        "held for the takeover"
    );
    assert_eq!(started(&mut c, t0, "ingress").1, Duration::ZERO);
    c.handle(t0, Input::VrrpStarted);
    assert_eq!(c.readiness(&[("api", Some(true))]), Ok(()));
    assert_eq!(
        c.readiness(&[("api", Some(true)), ("gone", None)]),
        Err("VRRP instance gone is not running".into())
    );
    // The hold ends (the watcher says so): forwarding stops with a rebuild.
    let out = c.handle(
        t0 + hold,
        Input::Ownership {
            name: "api".into(),
            id,
            forward: false,
        },
    );
    assert!(out.contains(&Effect::Apply));
    assert!(!c.forwarding());
    // A restart of the instance (a reload changed its VRID) starts without a hold.
    c.handle(t0 + s(9), Input::InstanceStopped { name: "api".into() });
    assert_eq!(started(&mut c, t0 + s(9), "api").1, Duration::ZERO);
    // The interface goes away: not ready; a stop clears ownership with one rebuild.
    c.handle(t0, Input::Attached(false));
    assert!(c.readiness(&[]).is_err());
    let out = c.handle(t0, Input::Stopping);
    assert!(out.is_empty(), "nothing forwarded: {out:?}");
}

#[test]
fn a_check_that_changed_while_a_reload_step_waited_survives_its_undo() {
    // The static VIPs' answer comes through the owner's loop: a backend fails meanwhile.
    let t0 = Instant::now();
    let mut c = Controller::new(
        Adopted {
            health: up(&["10.0.0.1"]),
            ..Default::default()
        },
        HOLD,
    );
    assert!(!c.reloading());
    let out = c.handle(
        t0,
        Input::ReloadStaged {
            fresh: up(&["10.0.0.1"]),
            hold: HOLD,
        },
    );
    assert_eq!(out, [Effect::InstallConfig, Effect::Apply]);
    assert_eq!(
        c.handle(t0, Input::Applied { error: None }),
        [Effect::SetStaticVips]
    );
    assert!(c.reloading());
    // Another apply's result (a health change's) does not move the reload on.
    c.handle(t0 + s(1), check("10.0.0.1", false, Some(true)));
    assert!(
        c.handle(t0 + s(1), Input::Applied { error: None })
            .is_empty()
    );
    // A second reload waits for this one.
    let out = c.handle(
        t0 + s(1),
        Input::ReloadStaged {
            fresh: HealthFacts::new(),
            hold: HOLD,
        },
    );
    assert_eq!(
        out,
        [Effect::ReloadDone(Err("a reload is in progress".into()))]
    );
    let out = c.handle(
        t0 + s(2),
        Input::StaticVipsSet {
            error: Some("netlink did not answer within 2s".into()),
        },
    );
    assert_eq!(out[0], Effect::RestoreConfig);
    let h = &c.health()[&pair("10.0.0.1")];
    assert!(!h.healthy, "the failure seen during the step stays");
    assert_eq!(h.hold_until, Some(t0 + s(31)));
    assert!(!c.reloading());
}
