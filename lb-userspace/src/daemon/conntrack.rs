//! The connection-table size for `/metrics` and `lbctl stats`, counted in the background.
//!
//! Counting means walking the whole LRU map (one syscall per key: about a second for a million
//! entries). Doing that inside a scrape, under the lock health and VRRP updates need, would
//! delay a dead backend's removal or a VIP move by as much. Instead a background task walks
//! its own descriptor of the pinned map, without any daemon lock, at most every
//! [`COUNT_EVERY`]; scrapes read the last count and its age.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use crate::dataplane::sync_view::LruPins;

/// How often the table is counted.
pub const COUNT_EVERY: Duration = Duration::from_secs(10);

/// The last count (entries, when, how long the walk took).
#[derive(Debug, Default)]
pub struct ConntrackCount {
    entries: AtomicU64,
    counted_at_unix_ms: AtomicU64,
    walk_ms: AtomicU64,
}

impl ConntrackCount {
    pub fn entries(&self) -> u64 {
        self.entries.load(Relaxed)
    }

    pub fn snapshot(&self) -> crate::status::ConntrackCountRow {
        crate::status::ConntrackCountRow {
            entries: self.entries.load(Relaxed),
            counted_at_unix_ms: self.counted_at_unix_ms.load(Relaxed),
            walk_ms: self.walk_ms.load(Relaxed),
        }
    }

    /// Walk the pinned map once (blocking; run it off the async threads).
    fn count(&self, pin: &std::path::Path) -> anyhow::Result<()> {
        let t = Instant::now();
        let mut n = 0u64;
        LruPins::open(pin)?.for_each(|_, _| {
            n += 1;
            true
        })?;
        self.entries.store(n, Relaxed);
        self.walk_ms.store(t.elapsed().as_millis() as u64, Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.counted_at_unix_ms.store(now, Relaxed);
        Ok(())
    }
}

/// Count the table pinned at `pin` now and every [`COUNT_EVERY`] (the task ends with lbd).
pub fn spawn_counter(pin: PathBuf) -> Arc<ConntrackCount> {
    let count = Arc::new(ConntrackCount::default());
    let c = count.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(COUNT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (c, pin) = (c.clone(), pin.clone());
            match tokio::task::spawn_blocking(move || c.count(&pin)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %format!("{e:#}"), "conntrack count"),
                Err(_) => return,
            }
        }
    });
    count
}
