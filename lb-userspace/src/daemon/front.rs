//! The API's side of the owner: each request becomes a [`Msg`] with a reply channel and a
//! deadline, so a slow owner shows as a clear error instead of a hung client. `/healthz` is
//! answered here, from the owner's last tick and the supervisor, without a round trip: it must
//! say "wedged" precisely when the owner cannot answer.

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Result;
use tokio::sync::{mpsc, oneshot};

use super::{
    owner::{LIVENESS_STALE, Msg},
    supervise::Shared,
};
use crate::api::{self, Request, Response};

/// How long a request may wait for the owner. A reload can restart VRRP instances and apply
/// the data plane twice; everything else is a read or a map update.
const QUERY_DEADLINE: Duration = Duration::from_secs(10);
const RELOAD_DEADLINE: Duration = Duration::from_secs(60);

pub struct Front {
    /// The owner's API inbox (bounded: see `owner`).
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    /// `lbctl trace` (`None` when the program has no trace maps).
    trace: Option<super::trace::Hub>,
}

impl Front {
    pub(super) fn new(
        tx: mpsc::Sender<Msg>,
        shared: Arc<Shared>,
        trace: Option<super::trace::Hub>,
    ) -> Self {
        Front { tx, shared, trace }
    }

    /// Run `task` (meant to run until lbd stops); its end is a failure (see `supervise`).
    pub fn supervise<F>(&self, name: &'static str, task: F) -> tokio::task::AbortHandle
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        self.shared.supervisor.supervise(name, task)
    }

    /// Ask the owner; `None` when it is gone (stopping) or missed the deadline.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Msg,
        deadline: Duration,
    ) -> Result<T, Response> {
        let (reply, rx) = oneshot::channel();
        let start = tokio::time::Instant::now();
        // A full queue (API load) makes this request wait here, not the owner.
        match tokio::time::timeout(deadline, self.tx.send(make(reply))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Response::error(503, "lbd is stopping")),
            Err(_) => {
                return Err(Response::error(
                    503,
                    format!("lbd's main loop did not answer within {deadline:?}"),
                ));
            }
        }
        match tokio::time::timeout_at(start + deadline, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(Response::error(503, "lbd is stopping")),
            Err(_) => Err(Response::error(
                503,
                format!("lbd's main loop did not answer within {deadline:?}"),
            )),
        }
    }

    fn healthz(&self) -> Response {
        let age = self.shared.since_tick();
        if age > LIVENESS_STALE {
            return Response::text(503, format!("main loop stalled for {age:?}\n"));
        }
        let (status, text) = self.shared.supervisor.healthz();
        Response::text(status, text)
    }

    async fn bgp(&self) -> Response {
        let (cfg, mut status) = match self.ask(Msg::BgpView, QUERY_DEADLINE).await {
            Ok(v) => v,
            Err(r) => return r,
        };
        // vtysh, beside the owner: a hung FRR delays only this answer.
        (status.sessions, status.sessions_error) = crate::bgp::sessions(cfg.bgp.first()).await;
        Response::json(&status)
    }
}

impl Front {
    async fn flows(&self, f: api::FlowFilter) -> Response {
        let view = match self.ask(Msg::FlowsView, QUERY_DEADLINE).await {
            Ok(v) => v,
            Err(r) => return r,
        };
        // The walk is one syscall per key: beside the owner, never in its loop.
        match tokio::task::spawn_blocking(move || super::flows::walk(&view, &f)).await {
            Ok(Ok(rows)) => Response::json(&rows),
            Ok(Err(e)) => Response::error(500, format!("read the flow maps: {e:#}")),
            Err(e) => Response::error(500, format!("flow walk: {e}")),
        }
    }

    async fn trace(&self, q: crate::explain::TraceQuery) -> Response {
        let Some(hub) = &self.trace else {
            return Response::error(500, "this data plane has no trace maps");
        };
        // Backend ids named as `lbctl flows` names them.
        let view = match self.ask(Msg::FlowsView, QUERY_DEADLINE).await {
            Ok(v) => v,
            Err(r) => return r,
        };
        let names = view.slots.iter().map(|(id, s)| (*id, s.1)).collect();
        match hub.sample(&q, &names).await {
            Ok(rows) => Response::json(&rows),
            Err(e) => Response::error(500, format!("trace: {e:#}")),
        }
    }
}

impl api::Handler for Front {
    async fn handle(self: &Arc<Self>, req: Request) -> Response {
        match req {
            Request::Healthz => self.healthz(),
            Request::Version => Response::json(&crate::status::VersionRow::this()),
            Request::Bgp => self.bgp().await,
            Request::Flows(f) => self.flows(f).await,
            Request::Trace(q) => self.trace(q).await,
            req => {
                let deadline = match req {
                    Request::Reload => RELOAD_DEADLINE,
                    _ => QUERY_DEADLINE,
                };
                self.ask(|reply| Msg::Api(req, reply), deadline)
                    .await
                    .unwrap_or_else(|r| r)
            }
        }
    }
}
