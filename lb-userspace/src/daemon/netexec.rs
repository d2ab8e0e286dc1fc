//! The netlink executor: the address changes the owner asks for (the static VIPs, a DSR
//! backend's VIPs on `lo`) run in a task beside it, so a slow kernel never holds the owner's
//! loop (health events, VRRP ownership and its acknowledgement go on meanwhile). Each request
//! is answered within [`DEADLINE`]: with its result, or with "no answer in time".
//!
//! A request that misses its deadline is not abandoned: the executor waits for it before it
//! starts the next one, and requests run one at a time in the order asked, on one netlink
//! connection. So a late answer can never land after the request that corrects it: a reload
//! whose static VIP add timed out is undone by a second request (the running config's VIPs),
//! which runs after the add has landed and removes what it added. The executor's own record of
//! what it holds follows each step as it lands (`static_vip::StaticVips`).
//!
//! Fault injection for the lab only: when the file named by `LB_TEST_NETLINK_DELAY_FILE`
//! exists, each request waits the milliseconds it holds before it is sent (a stalled kernel
//! answer; `tests/tests/lab_core.rs`). Unset in production, it costs one `stat` a request.

use std::{net::IpAddr, time::Duration};

use tokio::sync::{mpsc, oneshot};

use crate::static_vip::StaticVips;

/// How long the owner waits for a request's answer before it is told there was none.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// Test-only: a file holding a delay in ms for every request (see the module doc).
pub const DELAY_FILE_ENV: &str = "LB_TEST_NETLINK_DELAY_FILE";

pub enum Request {
    /// Hold exactly `want` as the static VIPs of the interface; `fresh`: the interface was
    /// recreated (its addresses went with the old device, and so did the announcer's socket).
    StaticVips { want: Vec<IpAddr>, fresh: bool },
    /// Hold `vip` on `lo`, unannounced (the DSR backend role).
    LocalVip(IpAddr),
}

struct Job {
    req: Request,
    reply: oneshot::Sender<Result<(), String>>,
}

/// The owner's handle on the executor.
pub struct NetExec {
    tx: mpsc::UnboundedSender<Job>,
}

impl NetExec {
    /// Start the executor for the static VIPs of `ifname`.
    pub fn spawn(handle: rtnetlink::Handle, ifname: &str) -> NetExec {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(handle, StaticVips::new(ifname), rx));
        NetExec { tx }
    }

    /// Queue `req`; its answer (an error after [`DEADLINE`] without one) comes on the receiver.
    pub fn ask(&self, req: Request) -> oneshot::Receiver<Result<(), String>> {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.tx.send(Job { req, reply }) {
            let _ = e.0.reply.send(Err("the netlink executor stopped".into()));
        }
        rx
    }

    /// [`NetExec::ask`] and wait for the answer (start-up, and steps that must know).
    pub async fn call(&self, req: Request) -> Result<(), String> {
        self.ask(req)
            .await
            .unwrap_or_else(|_| Err("the netlink executor stopped".into()))
    }
}

async fn run(
    handle: rtnetlink::Handle,
    mut statics: StaticVips,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    while let Some(Job { req, reply }) = rx.recv().await {
        let what = match &req {
            Request::StaticVips { want, .. } => format!("static VIPs {want:?}"),
            Request::LocalVip(v) => format!("{v} on lo"),
        };
        let work = execute(&handle, &mut statics, req);
        tokio::pin!(work);
        let deadline = tokio::time::sleep(DEADLINE);
        tokio::pin!(deadline);
        let mut reply = Some(reply);
        let result = loop {
            tokio::select! {
                r = &mut work => break r,
                _ = &mut deadline, if reply.is_some() => {
                    tracing::error!(request = %what, ?DEADLINE, "netlink did not answer in time; the next request waits for it");
                    if let Some(r) = reply.take() {
                        let _ = r.send(Err(format!("netlink did not answer within {DEADLINE:?} ({what})")));
                    }
                }
            }
        };
        match reply {
            Some(r) => {
                let _ = r.send(result.map_err(|e| format!("{e:#}")));
            }
            None => match result {
                Ok(()) => tracing::warn!(request = %what, "a late netlink answer landed"),
                Err(e) => {
                    tracing::warn!(request = %what, error = %format!("{e:#}"), "a late netlink answer failed")
                }
            },
        }
    }
}

async fn execute(
    handle: &rtnetlink::Handle,
    statics: &mut StaticVips,
    req: Request,
) -> anyhow::Result<()> {
    if let Some(delay) = crate::net::injected_delay(DELAY_FILE_ENV) {
        tokio::time::sleep(delay).await;
    }
    match req {
        Request::StaticVips { want, fresh } => {
            if fresh {
                *statics = StaticVips::new(statics.ifname());
            }
            statics.set(handle, want).await
        }
        Request::LocalVip(vip) => crate::net::ensure_local_vip(handle, vip).await,
    }
}
