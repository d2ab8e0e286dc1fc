//! Supervision and honest probes: a task that panics, fails or ends when it should run forever
//! (VRRP instance, health monitor, API listener, netlink watcher) is recorded as the daemon's
//! failure; `/healthz` then fails and `run` cleans up and exits non-zero, so kubelet restarts
//! lbd instead of it running half-dead. `/readyz` is true only with the data plane attached
//! and every configured VRRP instance running; `/healthz` also fails when the owner's loop
//! has not ticked for [`super::owner::LIVENESS_STALE`].

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use anyhow::Result;

use super::owner::Owner;

/// Records the first failure of any supervised task and lets the main loop wait for it.
pub struct Supervisor {
    failure: tokio::sync::watch::Sender<Option<String>>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor {
            failure: tokio::sync::watch::channel(None).0,
        }
    }
}

impl Supervisor {
    /// Record the first failure (later ones only log).
    pub fn fail(&self, what: String) {
        tracing::error!(failure = %what, "lbd task failed; stopping after cleanup");
        self.failure.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(what);
                true
            } else {
                false
            }
        });
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Wait until a failure is recorded.
    pub async fn failed(&self) -> String {
        let mut rx = self.failure.subscribe();
        loop {
            if let Some(f) = rx.borrow_and_update().clone() {
                return f;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Run `task` (meant to run until lbd stops) and treat its end, error or panic as a
    /// failure. Aborting the returned handle (at shutdown) is not a failure.
    pub fn supervise<F>(self: &Arc<Self>, name: &'static str, task: F) -> tokio::task::AbortHandle
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let handle = tokio::spawn(task);
        let abort = handle.abort_handle();
        let me = self.clone();
        tokio::spawn(async move {
            let why = match handle.await {
                Ok(Ok(())) => format!("{name} stopped"),
                Ok(Err(e)) => format!("{name} failed: {e:#}"),
                Err(e) if e.is_panic() => {
                    let p = e.into_panic();
                    let msg = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    format!("{name} panicked: {msg}")
                }
                Err(_) => return, // aborted on purpose
            };
            me.fail(why);
        });
        abort
    }

    /// `/healthz`: 200 while nothing failed, else 503 naming the failure.
    pub fn healthz(&self) -> (u16, String) {
        match self.failure() {
            None => (200, "ok\n".into()),
            Some(f) => (503, format!("failed: {f}\n")),
        }
    }
}

/// What the owner and the API's front share without a message: the first failure and the
/// loop's last tick, on the monotonic clock (a wall-clock step must not make a wedged loop
/// look live, nor a live one wedged).
pub struct Shared {
    pub supervisor: Arc<Supervisor>,
    started: std::time::Instant,
    /// When the owner's loop last ticked, in ms since `started`.
    last_tick_ms: AtomicU64,
}

impl Shared {
    pub fn new() -> Self {
        Shared {
            supervisor: Arc::default(),
            started: std::time::Instant::now(),
            last_tick_ms: AtomicU64::new(0),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The owner's loop is alive: called on every tick.
    pub fn tick(&self) {
        self.last_tick_ms.store(self.elapsed_ms(), Relaxed);
    }

    /// Time since the owner's loop last ticked.
    pub fn since_tick(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.elapsed_ms()
                .saturating_sub(self.last_tick_ms.load(Relaxed)),
        )
    }

    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}

impl Owner {
    /// VRRP instances whose task ended (a panic: they only end on shutdown otherwise).
    pub(super) fn check_vrrp_tasks(&self) {
        if let Some(h) = self.vrrp.iter().find(|h| !h.instance.is_running()) {
            self.shared
                .supervisor
                .fail(format!("VRRP instance {} stopped unexpectedly", h.cfg.name));
        }
    }

    /// `/readyz`: started, data plane attached to the interface, every configured VRRP
    /// instance running, nothing failed.
    pub(super) fn readyz(&self) -> (u16, String) {
        if let Some(f) = self.shared.supervisor.failure() {
            return (503, format!("failed: {f}\n"));
        }
        let instances: Vec<(&str, Option<bool>)> = self
            .cfg
            .vrrp
            .iter()
            .map(|r| {
                let running = self.vrrp.iter().find(|h| h.cfg.name == r.name);
                (r.name.as_str(), running.map(|h| h.instance.is_running()))
            })
            .collect();
        if let Err(why) = self.ctl.readiness(&instances) {
            return (503, format!("{why}\n"));
        }
        (200, "ready\n".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn a_panicking_task_fails_healthz_and_wakes_the_main_loop() {
        let s = Arc::new(Supervisor::default());
        let _fine = s.supervise("forever", std::future::pending());
        settle().await;
        assert_eq!(s.healthz().0, 200);
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.failed().await })
        };
        s.supervise("VRRP instance api", async { panic!("boom") });
        let why = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the main loop is woken")
            .unwrap();
        assert_eq!(why, "VRRP instance api panicked: boom");
        let (status, text) = s.healthz();
        assert_eq!(status, 503);
        assert!(text.contains("panicked: boom"), "{text}");
    }

    #[tokio::test]
    async fn errors_and_unexpected_ends_are_failures_aborts_are_not() {
        let s = Arc::new(Supervisor::default());
        let h = s.supervise("metrics listener", std::future::pending());
        h.abort();
        settle().await;
        assert_eq!(s.failure(), None, "an abort at shutdown is not a failure");
        s.supervise("API listener", async {
            anyhow::bail!("bind: address in use")
        });
        settle().await;
        assert_eq!(
            s.failure().as_deref(),
            Some("API listener failed: bind: address in use")
        );
        // The first failure is the one reported.
        s.supervise("health monitor", async { Ok(()) });
        settle().await;
        assert!(s.failure().unwrap().starts_with("API listener"));
        let s2 = Arc::new(Supervisor::default());
        s2.supervise("health monitor", async { Ok(()) });
        settle().await;
        assert_eq!(s2.failure().as_deref(), Some("health monitor stopped"));
    }

    #[test]
    fn the_tick_age_is_monotonic() {
        let s = Shared::new();
        s.tick();
        std::thread::sleep(Duration::from_millis(20));
        let age = s.since_tick();
        assert!(age >= Duration::from_millis(20), "{age:?}");
    }
}
