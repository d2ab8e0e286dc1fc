//! `GET /v1/trace`: a live sample of the data plane's decisions. While a trace request runs,
//! the program's trace switch is on and its ring buffer is read here, beside the owner; when the
//! request ends (answered, timed out, or its client gone) the switch goes off, so the program
//! writes nothing while no trace is attached. One trace at a time: a second waits its turn.

use std::{
    collections::HashMap,
    net::IpAddr,
    os::fd::{AsRawFd, RawFd},
    sync::Arc,
    time::Duration,
};

use anyhow::Result;
use tokio::{io::unix::AsyncFd, sync::Mutex};

use crate::{
    dataplane::TraceTap,
    explain::{TraceQuery, trace_row},
    status::TracesRow,
};

struct Tap(TraceTap);

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.0.ring.as_raw_fd()
    }
}

pub struct Hub {
    tap: Arc<Mutex<AsyncFd<Tap>>>,
}

/// The switch is on while this lives (dropped with the request, whatever ends it).
struct Attached(tokio::sync::OwnedMutexGuard<AsyncFd<Tap>>);

impl Drop for Attached {
    fn drop(&mut self) {
        if let Err(e) = self.0.get_mut().0.set(false) {
            tracing::error!(error = %format!("{e:#}"), "could not turn data-plane tracing off");
        }
    }
}

impl Hub {
    pub fn new(tap: TraceTap) -> Result<Hub> {
        let mut tap = Tap(tap);
        // Off whatever a previous lbd left.
        tap.0.set(false)?;
        // SAFETY: the fd is the ring buffer map's, owned by `tap` and open until it is dropped
        // with the `AsyncFd`.
        let fd = unsafe { AsyncFd::register_with_interest(tap, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Hub {
            tap: Arc::new(Mutex::new(fd)),
        })
    }

    /// Up to `q.count` decisions of the flows `q` asks for, waiting at most `q.wait_ms`.
    /// `names`: backend slot id -> backend address.
    pub async fn sample(&self, q: &TraceQuery, names: &HashMap<u32, IpAddr>) -> Result<TracesRow> {
        let mut g = Attached(self.tap.clone().lock_owned().await);
        // Left in the ring by an earlier trace: not this one's.
        while g.0.get_mut().0.next_record().is_some() {}
        g.0.get_mut().0.set(true)?;
        let mut out = TracesRow::default();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(q.wait_ms);
        loop {
            while let Some(rec) = g.0.get_mut().0.next_record() {
                let row = trace_row(&rec, |id| names.get(&id).copied());
                if !q.wants(row.vip, row.port) {
                    out.filtered += 1;
                    continue;
                }
                out.decisions.push(row);
                if out.decisions.len() == q.count {
                    return Ok(out);
                }
            }
            match tokio::time::timeout_at(deadline, g.0.readable_mut()).await {
                Err(_) => {
                    out.timed_out = true;
                    return Ok(out);
                }
                Ok(ready) => ready?.clear_ready(),
            }
        }
    }
}
