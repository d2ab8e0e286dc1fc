//! Probes and the monitor against real sockets on 127.0.0.1 (see `testsupport`).

use std::time::{Duration, Instant};

use super::testsupport::*;
use super::*;

fn cfg(kind: CheckKind, timeout_ms: u64) -> HealthConfig {
    HealthConfig {
        kind,
        interval_ms: timeout_ms.max(50),
        timeout_ms,
        ..HealthConfig::default()
    }
}

async fn probe(kind: CheckKind, addr: std::net::SocketAddr) -> Result<(), ProbeFailure> {
    ProbeSpec::new(addr, &cfg(kind, 1000), None).run().await
}

#[tokio::test]
async fn https_ready_is_ok_and_unready_is_bad_status() {
    let srv = https_server().await;
    assert_eq!(probe(CheckKind::Https, srv.addr).await, Ok(()));
    srv.set_ready(false);
    assert_eq!(
        probe(CheckKind::Https, srv.addr).await,
        Err(ProbeFailure::BadStatus(500))
    );
    // With an SNI the handshake works the same (the certificate is not checked).
    let spec = ProbeSpec::new(srv.addr, &cfg(CheckKind::Https, 1000), Some("localhost"));
    srv.set_ready(true);
    assert_eq!(spec.run().await, Ok(()));
}

#[tokio::test]
async fn http_ready_unready_and_expected_status() {
    let srv = http_server().await;
    assert_eq!(probe(CheckKind::Http, srv.addr).await, Ok(()));
    srv.set_ready(false);
    assert_eq!(
        probe(CheckKind::Http, srv.addr).await,
        Err(ProbeFailure::BadStatus(500))
    );
    let want_500 = HealthConfig {
        expect_status: "500".parse().unwrap(),
        ..cfg(CheckKind::Http, 1000)
    };
    assert_eq!(
        ProbeSpec::new(srv.addr, &want_500, None).run().await,
        Ok(())
    );
}

#[tokio::test]
async fn tcp_connect() {
    let srv = http_server().await;
    assert_eq!(probe(CheckKind::Tcp, srv.addr).await, Ok(()));
    let closed = closed_port().await;
    assert_eq!(
        probe(CheckKind::Tcp, closed).await,
        Err(ProbeFailure::Refused)
    );
}

#[tokio::test]
async fn closed_port_is_refused() {
    let closed = closed_port().await;
    for kind in [CheckKind::Https, CheckKind::Http] {
        assert_eq!(probe(kind, closed).await, Err(ProbeFailure::Refused));
    }
}

#[tokio::test]
async fn hang_times_out_within_the_timeout() {
    let srv = hang_server().await;
    for (kind, stage) in [
        (CheckKind::Https, Stage::Tls),
        (CheckKind::Http, Stage::Response),
    ] {
        let started = Instant::now();
        let r = ProbeSpec::new(srv.addr, &cfg(kind, 200), None).run().await;
        let took = started.elapsed();
        assert!(
            matches!(r, Err(ProbeFailure::Timeout { stage: s, .. }) if s == stage),
            "{kind}: {r:?}"
        );
        assert!(
            took >= Duration::from_millis(190) && took < Duration::from_millis(400),
            "{kind}: {took:?}"
        );
    }
}

#[tokio::test]
async fn garbage_is_a_failure() {
    let srv = garbage_server().await;
    let r = probe(CheckKind::Http, srv.addr).await;
    assert!(
        matches!(
            r,
            Err(ProbeFailure::Garbage(_) | ProbeFailure::Io { .. } | ProbeFailure::Closed)
        ),
        "{r:?}"
    );
    let r = probe(CheckKind::Https, srv.addr).await;
    assert!(matches!(r, Err(ProbeFailure::Tls(_))), "{r:?}");
}

#[tokio::test]
async fn tls_to_a_plain_port_fails() {
    let srv = http_server().await;
    let r = ProbeSpec::new(srv.addr, &cfg(CheckKind::Https, 300), None)
        .run()
        .await;
    assert!(r.is_err(), "{r:?}");
    // And plain HTTP to a TLS port is not mistaken for an answer.
    let tls = https_server().await;
    let r = ProbeSpec::new(tls.addr, &cfg(CheckKind::Http, 300), None)
        .run()
        .await;
    assert!(r.is_err(), "{r:?}");
}

async fn next_event(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<HealthEvent>,
    within: Duration,
) -> HealthEvent {
    tokio::time::timeout(within, rx.recv())
        .await
        .expect("an event in time")
        .expect("the monitor is alive")
}

/// The next event that changes a target's state (a failure of another kind while down is
/// reported too, with `state == previous`).
async fn next_change(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<HealthEvent>,
    within: Duration,
) -> HealthEvent {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let ev = next_event(rx, left).await;
        if ev.state != ev.previous {
            return ev;
        }
    }
}

#[tokio::test]
async fn a_hanging_target_does_not_delay_another() {
    let hang = hang_server().await;
    let good = http_server().await;
    let fast = HealthConfig {
        kind: CheckKind::Http,
        interval_ms: 50,
        timeout_ms: 50,
        ..HealthConfig::default()
    };
    let slow = HealthConfig {
        kind: CheckKind::Https,
        interval_ms: 1000,
        timeout_ms: 1000,
        ..HealthConfig::default()
    };
    let (mon, mut rx) = HealthMonitor::start(vec![
        Target::new("hang", hang.addr, slow),
        Target::new("good", good.addr, fast),
    ]);
    let ev = next_event(&mut rx, Duration::from_millis(500)).await;
    assert_eq!((ev.id.as_str(), ev.healthy), ("good", true));
    assert_eq!(ev.previous, Health::Unknown);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let st = mon.status();
    let good_st = st.iter().find(|s| s.id == "good").unwrap();
    // ~1.3 s at one probe per 45-50 ms: well over 10 even on a loaded machine.
    assert!(good_st.checks_run >= 10, "{good_st:?}");
    assert_eq!(good_st.checks_failed, 0);
    let hang_st = st.iter().find(|s| s.id == "hang").unwrap();
    assert!(hang_st.checks_run <= 2, "{hang_st:?}");
    let ev = next_event(&mut rx, Duration::from_millis(2000)).await;
    assert_eq!((ev.id.as_str(), ev.state), ("hang", Health::Down));
    assert!(ev.reason.starts_with("timeout after"), "{}", ev.reason);
    mon.stop();
    assert!(mon.status().is_empty());
}

#[tokio::test]
async fn rise_fall_events_and_reload() {
    let srv = https_server().await;
    // A timeout well above what a local TLS answer takes on a loaded machine: this test is about
    // the rise and fall counts, and a timeout between two answers is a soft failure of its own
    // (an event with `state == previous`), which `next_change` skips.
    let c = HealthConfig {
        interval_ms: 30,
        timeout_ms: 1000,
        rise: 2,
        fall: 3,
        ..HealthConfig::default()
    };
    let t = Target::new("api/a", srv.addr, c.clone());
    let (mon, mut rx) = HealthMonitor::start(vec![t.clone()]);
    let ev = next_event(&mut rx, Duration::from_secs(1)).await;
    assert_eq!((ev.healthy, ev.previous), (true, Health::Unknown));
    assert_eq!(mon.state("api/a"), Some(Health::Up));

    srv.set_ready(false);
    let ev = next_event(&mut rx, Duration::from_secs(1)).await;
    assert_eq!((ev.healthy, ev.previous), (false, Health::Up));
    assert_eq!(ev.reason, "bad status 500");
    let st = &mon.status()[0];
    assert!(
        st.consecutive_failures >= 3 && st.checks_failed >= 3,
        "{st:?}"
    );

    srv.set_ready(true);
    let ev = next_change(&mut rx, Duration::from_secs(2)).await;
    assert!(ev.healthy, "{ev:?}");
    assert!(mon.status()[0].consecutive_successes >= 2);

    // Reload: the same target (and a changed interval) keeps its state, no event; a new
    // target starts Unknown and reports; the removed one goes without an event.
    let slower = Target::new(
        "api/a",
        srv.addr,
        HealthConfig {
            interval_ms: 40,
            ..c.clone()
        },
    );
    let other = Target::new("api/b", srv.addr, c.clone());
    mon.set_targets(vec![slower, other]);
    assert_eq!(mon.state("api/a"), Some(Health::Up));
    let ev = next_event(&mut rx, Duration::from_secs(1)).await;
    assert_eq!((ev.id.as_str(), ev.healthy), ("api/b", true));
    mon.set_targets(vec![t]);
    let ids: Vec<_> = mon.status().into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["api/a"]);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), rx.recv())
            .await
            .is_err(),
        "no event expected"
    );
}

#[tokio::test]
async fn kind_none_is_up_at_once_and_known_backends_can_start_up() {
    let closed = closed_port().await;
    let none = HealthConfig {
        kind: CheckKind::None,
        ..HealthConfig::default()
    };
    let adopted = HealthConfig {
        kind: CheckKind::Tcp,
        interval_ms: 20,
        timeout_ms: 20,
        // Never reached: a refusal takes it down at once.
        fall: 1000,
        ..HealthConfig::default()
    };
    let (mon, mut rx) = HealthMonitor::start(vec![
        Target::new("none", closed, none),
        Target::new("adopted", closed, adopted).starting(Health::Up),
    ]);
    assert_eq!(mon.state("adopted"), Some(Health::Up));
    let mut seen = Vec::new();
    for _ in 0..2 {
        let ev = next_event(&mut rx, Duration::from_secs(1)).await;
        seen.push((ev.id, ev.previous, ev.state));
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        [
            ("adopted".to_string(), Health::Up, Health::Down),
            ("none".to_string(), Health::Unknown, Health::Up),
        ]
    );
    // Nothing listens: a refusal took it down at once, without waiting for `fall`.
    assert!(mon.status()[0].checks_run < 1000);
    assert_eq!(mon.status()[0].last_result, "connection refused");
}

#[tokio::test]
async fn local_tracking_target_on_loopback() {
    // The shape the daemon uses for VRRP tracking: the local apiserver's /readyz over HTTPS.
    let srv = https_server().await;
    let local = std::net::SocketAddr::new([127, 0, 0, 1].into(), srv.addr.port());
    let (mon, mut rx) = HealthMonitor::start(vec![Target::new(
        "track/apiserver",
        local,
        HealthConfig::https("/readyz"),
    )]);
    let ev = next_event(&mut rx, Duration::from_secs(1)).await;
    assert!(ev.healthy);
    let json = serde_json::to_value(mon.status()).unwrap();
    assert_eq!(json[0]["state"], "up");
    assert_eq!(json[0]["kind"], "https");
    assert_eq!(json[0]["last_result"], "ok");
}

#[tokio::test]
async fn a_gate_that_does_not_answer_fails_the_check_whatever_the_backend_says() {
    // A routed backend: its own address answers, but its `lbd decap` (the gate) may not.
    let srv = http_server().await;
    let decap = http_server().await;
    let spec = |gate| ProbeSpec::new(srv.addr, &cfg(CheckKind::Http, 1000), None).with_gate(gate);
    assert_eq!(spec(Some(decap.addr)).run().await, Ok(()));
    let closed = closed_port().await;
    match spec(Some(closed)).run().await {
        Err(ProbeFailure::Gate(why)) => assert!(why.contains(&closed.to_string()), "{why}"),
        other => panic!("expected the gate to fail the check: {other:?}"),
    }
    assert!(
        ProbeFailure::Gate("x".into())
            .to_string()
            .contains("lbd decap"),
        "the reason names what is missing"
    );
    // The backend's own result still counts when the gate answers.
    srv.set_ready(false);
    assert_eq!(
        spec(Some(decap.addr)).run().await,
        Err(ProbeFailure::BadStatus(500))
    );
}
