//! The daemon's API: JSON over HTTP/1.1 on a unix socket (mode 0600), and an optional TCP
//! listener that serves only `/metrics`, `/healthz` and `/readyz`. This module is transport only:
//! it turns requests into [`Request`] values for a [`Handler`] and answers with its JSON.

use std::sync::Arc;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};

/// Bounds on what one client can make the daemon hold. The TCP listener is reachable from
/// the network (Prometheus, kubelet probes), so a slow or huge request must cost little.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body; bigger ones get 413 (the API's bodies are a few hundred bytes).
    pub max_body: usize,
    /// The read buffer, which bounds the request line and headers (hyper's minimum is 8 KiB).
    pub max_header_buf: usize,
    /// Time to receive a request's headers.
    pub header_read_timeout: std::time::Duration,
    /// Time to receive a request's body once its headers are in (408 after it): a client that
    /// trickles a body cannot hold a slot for the whole connection lifetime.
    pub body_read_timeout: std::time::Duration,
    /// Time one connection may live (keep-alive included), so idle ones free their slot.
    pub connection_lifetime: std::time::Duration,
    /// Connections served at once; more are closed at once.
    pub max_connections: usize,
}

impl Limits {
    pub const TCP: Limits = Limits {
        max_body: 64 * 1024,
        max_header_buf: 16 * 1024,
        header_read_timeout: std::time::Duration::from_secs(5),
        body_read_timeout: std::time::Duration::from_secs(5),
        connection_lifetime: std::time::Duration::from_secs(60),
        max_connections: 64,
    };
    /// The unix socket is root-only (mode 0600): same size bounds, more room for lbctl.
    pub const UNIX: Limits = Limits {
        max_connections: 256,
        connection_lifetime: std::time::Duration::from_secs(600),
        ..Limits::TCP
    };
}

/// Body of drain/undrain requests.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DrainRequest {
    /// VIP name or address.
    pub vip: String,
    pub backend: std::net::IpAddr,
}

/// The query of `GET /v1/flows`: `vip`, `port`, `client`, `client_port`, `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowFilter {
    pub vip: Option<std::net::IpAddr>,
    pub port: Option<u16>,
    pub client: Option<std::net::IpAddr>,
    pub client_port: Option<u16>,
    /// Most entries returned per table.
    pub limit: usize,
}

impl Default for FlowFilter {
    fn default() -> Self {
        FlowFilter {
            vip: None,
            port: None,
            client: None,
            client_port: None,
            limit: 100,
        }
    }
}

/// The `name=value` pairs of a query string `a=b&c=d` (the API's queries carry addresses and
/// numbers: nothing needs unescaping); a pair without `=` is an error naming it.
pub fn query_pairs(query: &str) -> impl Iterator<Item = Result<(&str, &str), String>> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        pair.split_once('=')
            .ok_or_else(|| format!("{pair:?}: want name=value"))
    })
}

impl FlowFilter {
    /// Parse `a=b&c=d` (values are addresses and numbers: nothing needs escaping, and a
    /// field it does not know is refused by name).
    pub fn parse(query: &str) -> Result<FlowFilter, String> {
        let mut f = FlowFilter::default();
        for pair in crate::api::query_pairs(query) {
            let (k, v) = pair?;
            let bad = |what: &str| format!("{k}: {v:?} is not {what}");
            match k {
                "vip" => f.vip = Some(v.parse().map_err(|_| bad("an IP address"))?),
                "client" => f.client = Some(v.parse().map_err(|_| bad("an IP address"))?),
                "port" => f.port = Some(v.parse().map_err(|_| bad("a port"))?),
                "client_port" => f.client_port = Some(v.parse().map_err(|_| bad("a port"))?),
                "limit" => f.limit = v.parse().map_err(|_| bad("a number"))?,
                _ => {
                    return Err(format!(
                        "{k}: unknown (want vip, port, client, client_port, limit)"
                    ));
                }
            }
        }
        Ok(f)
    }

    /// The query string for [`FlowFilter::parse`].
    pub fn query(&self) -> String {
        let mut q = vec![format!("limit={}", self.limit)];
        if let Some(a) = self.vip {
            q.push(format!("vip={a}"));
        }
        if let Some(p) = self.port {
            q.push(format!("port={p}"));
        }
        if let Some(a) = self.client {
            q.push(format!("client={a}"));
        }
        if let Some(p) = self.client_port {
            q.push(format!("client_port={p}"));
        }
        q.join("&")
    }
}

#[derive(Clone, Debug)]
pub enum Request {
    /// Connection-table and flow-cache entries.
    Flows(FlowFilter),
    /// Where one packet of a flow goes and why (the program's dry run).
    Explain(crate::explain::ExplainQuery),
    /// A live sample of data-plane decisions.
    Trace(crate::explain::TraceQuery),
    Backends,
    Vips,
    Stats,
    Vrrp,
    /// BGP sessions and announcements.
    Bgp,
    /// Drain (true) or undrain this node's BGP announcements.
    BgpDrain(bool),
    Drain(DrainRequest),
    Undrain(DrainRequest),
    Reload,
    /// lbd's version (answered without the owner).
    Version,
    Healthz,
    Readyz,
    Metrics,
}

/// An answer: a status and a JSON body (or Prometheus text for metrics).
pub struct Response {
    pub status: u16,
    pub body: String,
    pub content_type: &'static str,
}

impl Response {
    pub fn json<T: Serialize>(v: &T) -> Response {
        Response {
            status: 200,
            body: serde_json::to_string_pretty(v)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
            content_type: "application/json",
        }
    }
    pub fn error(status: u16, msg: impl std::fmt::Display) -> Response {
        Response {
            status,
            body: serde_json::json!({ "error": msg.to_string() }).to_string(),
            content_type: "application/json",
        }
    }
    /// The metrics exposition (prometheus-client writes OpenMetrics text).
    pub fn openmetrics(body: String) -> Response {
        Response {
            status: 200,
            body,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
    pub fn text(status: u16, body: String) -> Response {
        Response {
            status,
            body,
            content_type: "text/plain; version=0.0.4",
        }
    }
}

pub trait Handler: Send + Sync + 'static {
    fn handle(self: &Arc<Self>, req: Request)
    -> impl std::future::Future<Output = Response> + Send;
}

fn route(
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
    full_api: bool,
) -> Result<Request, Response> {
    let parse = |b: &[u8]| {
        serde_json::from_slice::<DrainRequest>(b).map_err(|e| {
            Response::error(
                400,
                format!("body: {e} (want {{\"vip\":..,\"backend\":..}})"),
            )
        })
    };
    let req = match (method, path) {
        (&Method::GET, "/healthz") => Request::Healthz,
        (&Method::GET, "/readyz") => Request::Readyz,
        (&Method::GET, "/metrics") => Request::Metrics,
        _ if !full_api => {
            return Err(Response::error(
                404,
                format!("{path}: not served on this listener"),
            ));
        }
        (&Method::GET, "/v1/backends") => Request::Backends,
        (&Method::GET, "/v1/vips") => Request::Vips,
        (&Method::GET, "/v1/stats") => Request::Stats,
        (&Method::GET, "/v1/vrrp") => Request::Vrrp,
        (&Method::GET, "/v1/bgp") => Request::Bgp,
        (&Method::GET, "/v1/version") => Request::Version,
        (&Method::GET, "/v1/flows") => Request::Flows(
            FlowFilter::parse(query.unwrap_or(""))
                .map_err(|e| Response::error(400, format!("query: {e}")))?,
        ),
        (&Method::GET, "/v1/explain") => Request::Explain(
            crate::explain::ExplainQuery::parse(query.unwrap_or(""))
                .map_err(|e| Response::error(400, format!("query: {e}")))?,
        ),
        (&Method::GET, "/v1/trace") => Request::Trace(
            crate::explain::TraceQuery::parse(query.unwrap_or(""))
                .map_err(|e| Response::error(400, format!("query: {e}")))?,
        ),
        (&Method::POST, "/v1/bgp/drain") => Request::BgpDrain(true),
        (&Method::POST, "/v1/bgp/undrain") => Request::BgpDrain(false),
        (&Method::POST, "/v1/backends/drain") => Request::Drain(parse(body)?),
        (&Method::POST, "/v1/backends/undrain") => Request::Undrain(parse(body)?),
        (&Method::POST, "/v1/reload") => Request::Reload,
        _ => {
            return Err(Response::error(
                404,
                format!("{method} {path}: no such endpoint"),
            ));
        }
    };
    Ok(req)
}

pub(crate) async fn serve_conn<S, H>(io: S, handler: Arc<H>, full_api: bool, limits: Limits)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let handler = handler.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = tokio::time::timeout(
                limits.body_read_timeout,
                http_body_util::Limited::new(body, limits.max_body).collect(),
            )
            .await;
            let resp = match body {
                Err(_) => Response::error(
                    408,
                    format!(
                        "request body not received within {:?}",
                        limits.body_read_timeout
                    ),
                ),
                Ok(Err(_)) => Response::error(
                    413,
                    format!("request body larger than {} bytes", limits.max_body),
                ),
                Ok(Ok(body)) => {
                    let body = body.to_bytes();
                    match route(
                        &parts.method,
                        parts.uri.path(),
                        parts.uri.query(),
                        &body,
                        full_api,
                    ) {
                        Ok(r) => handler.handle(r).await,
                        Err(resp) => resp,
                    }
                }
            };
            let mut out = hyper::Response::new(Full::new(Bytes::from(resp.body)));
            *out.status_mut() =
                StatusCode::from_u16(resp.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            out.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(resp.content_type),
            );
            if resp.status == 408 {
                // The rest of that body is not worth waiting for: close the connection.
                out.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(out)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_buf)
        .serve_connection(TokioIo::new(io), svc);
    match tokio::time::timeout(limits.connection_lifetime, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "API connection ended with an error"),
        Err(_) => tracing::debug!("API connection closed after its lifetime"),
    }
}

/// Accept connections from `accept` and serve each within `limits`: over the connection cap,
/// a new connection is closed at once (counted), never queued.
async fn serve_accepted<S, H, F, Fut>(
    mut accept: F,
    handler: Arc<H>,
    full_api: bool,
    limits: Limits,
) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Handler,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<S>>,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut refused: u64 = 0;
    loop {
        let stream = match accept().await {
            Ok(s) => s,
            // Out of descriptors or an aborted handshake: not fatal for the listener.
            Err(e) if is_transient(&e) => {
                tracing::warn!(error = %e, "API accept failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    refused,
                    max = limits.max_connections,
                    "API connection limit reached; closing new connections"
                );
            }
            drop(stream);
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            serve_conn(stream, handler, full_api, limits).await;
            drop(permit);
        });
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::ECONNABORTED
                | libc::EPROTO
        )
    ) || e.kind() == std::io::ErrorKind::ConnectionAborted
}

/// Serve the full API on a unix socket with mode 0600 (replacing a stale socket file).
pub async fn serve_unix<H: Handler>(path: std::path::PathBuf, handler: Arc<H>) -> Result<()> {
    let path = path.as_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let listener = bind_private(path)?;
    serve_accepted(
        || async { listener.accept().await.map(|(s, _)| s) },
        handler,
        true,
        Limits::UNIX,
    )
    .await
}

/// Bind the root-only API socket at `path`: bound in a directory of its own (mode 0700), set
/// to 0600 there, then renamed into place, so it never exists at `path` with the umask's mode
/// (a chmod after the bind leaves a window in which anyone may connect).
fn bind_private(path: &std::path::Path) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let name = path
        .file_name()
        .with_context(|| format!("API socket {} has no file name", path.display()))?;
    let private = path.with_file_name(format!(
        ".{}.{}.bind",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("create {}", private.display()))?;
    let result = (|| {
        let staged = private.join("s");
        let listener = tokio::net::UnixListener::bind(&staged)
            .with_context(|| format!("bind {}", path.display()))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        // Replaces an old socket in one step.
        std::fs::rename(&staged, path)
            .with_context(|| format!("move the API socket to {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

/// Serve only /metrics, /healthz and /readyz on TCP (for probes and Prometheus).
pub async fn serve_tcp<H: Handler>(addr: std::net::SocketAddr, handler: Arc<H>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind {addr}"))?;
    serve_tcp_on(listener, handler, Limits::TCP).await
}

/// [`serve_tcp`] on a bound listener with the given limits.
pub async fn serve_tcp_on<H: Handler>(
    listener: tokio::net::TcpListener,
    handler: Arc<H>,
    limits: Limits,
) -> Result<()> {
    serve_accepted(
        || async { listener.accept().await.map(|(s, _)| s) },
        handler,
        false,
        limits,
    )
    .await
}

/// Why a call to lbd failed: lbctl's exit code tells "not reachable" from "refused".
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No lbd listens on the socket (missing, refused, permission denied).
    #[error("connect to lbd at {socket} (is lbd running? see --socket): {error}")]
    Unreachable {
        socket: String,
        error: std::io::Error,
    },
    /// Connected, but no answer in time: a wedged lbd.
    #[error(
        "lbd at {socket} did not answer {path} within {timeout:?} (is it wedged? see its log; --timeout sets the limit)"
    )]
    Timeout {
        socket: String,
        path: String,
        timeout: std::time::Duration,
    },
    /// lbd answered with an error status: the command was refused.
    #[error("lbd answered {status} {reason}: {message}")]
    Refused {
        status: u16,
        /// The status's canonical reason ("Unprocessable Entity").
        reason: &'static str,
        message: String,
    },
    /// The connection broke, or the answer was not what this lbctl understands.
    #[error("{0:#}")]
    Protocol(anyhow::Error),
}

impl CallError {
    /// lbd could not be asked at all (as opposed to: it answered no).
    pub fn unreachable(&self) -> bool {
        matches!(
            self,
            CallError::Unreachable { .. } | CallError::Timeout { .. }
        )
    }
}

/// The client `lbctl` uses.
pub struct Client {
    socket: std::path::PathBuf,
    timeout: std::time::Duration,
}

impl Client {
    /// A client whose calls give up after 5 s.
    pub fn new(socket: impl Into<std::path::PathBuf>) -> Self {
        Client {
            socket: socket.into(),
            timeout: std::time::Duration::from_secs(5),
        }
    }

    /// Give up on a call (connect, request and answer) after `timeout`: a wedged lbd that
    /// accepts connections but never answers must not hang lbctl or a probe.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A JSON endpoint as untyped JSON (the text endpoints `/metrics`, `/healthz`, `/readyz`
    /// as a JSON string).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<serde_json::Value, CallError> {
        let text = self.text(method, path, body).await?;
        if matches!(path, "/metrics" | "/healthz" | "/readyz") {
            return Ok(serde_json::Value::String(text));
        }
        serde_json::from_str(&text).map_err(|e| {
            CallError::Protocol(anyhow::anyhow!("lbd's answer to {path} is not JSON: {e}"))
        })
    }

    /// A JSON endpoint read into its row type (crate::status).
    pub async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.typed(Method::GET, path, None).await
    }

    /// A POST whose answer is read into `T`.
    pub async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: Option<String>,
    ) -> Result<T, CallError> {
        self.typed(Method::POST, path, body).await
    }

    async fn typed<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<T, CallError> {
        let text = self.text(method, path, body).await?;
        let de = &mut serde_json::Deserializer::from_str(&text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            CallError::Protocol(anyhow::anyhow!(
                "lbd's answer to {path} does not read as this lbctl's {} ({e}): is lbd another version? (lbctl version)",
                std::any::type_name::<T>().rsplit("::").next().unwrap_or("row")
            ))
        })
    }

    /// The body of a successful answer.
    pub async fn text(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<String, CallError> {
        match tokio::time::timeout(self.timeout, self.call_inner(method, path, body)).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout {
                socket: self.socket.display().to_string(),
                path: path.to_string(),
                timeout: self.timeout,
            }),
        }
    }

    async fn call_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<String, CallError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|error| CallError::Unreachable {
                socket: self.socket.display().to_string(),
                error,
            })?;
        let proto = |e: hyper::Error| CallError::Protocol(e.into());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(proto)?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "lbd")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CallError::Protocol(e.into()))?;
        let resp = sender.send_request(req).await.map_err(proto)?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(proto)?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).to_string();
        if !status.is_success() {
            let message = serde_json::from_str::<crate::status::ErrorRow>(&text)
                .map(|e| e.error)
                .unwrap_or(text);
            return Err(CallError::Refused {
                status: status.as_u16(),
                reason: status.canonical_reason().unwrap_or(""),
                message,
            });
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_silent_lbd_gives_a_clear_timeout() {
        let path = std::env::temp_dir().join(format!("lb-api-silent-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Accepts, then never answers: a wedged daemon.
        let hold = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            drop(s);
        });
        let started = std::time::Instant::now();
        let e = Client::new(&path)
            .with_timeout(std::time::Duration::from_millis(300))
            .call(Method::GET, "/v1/stats", None)
            .await
            .unwrap_err()
            .to_string();
        hold.abort();
        let _ = std::fs::remove_file(&path);
        assert!(e.contains("did not answer /v1/stats within 300ms"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn routes() {
        let r = route(&Method::GET, "/v1/backends", None, b"", true)
            .ok()
            .unwrap();
        assert!(matches!(r, Request::Backends));
        let r = route(
            &Method::POST,
            "/v1/backends/drain",
            None,
            br#"{"vip":"api","backend":"10.0.0.1"}"#,
            true,
        )
        .ok()
        .unwrap();
        assert!(matches!(r, Request::Drain(d) if d.vip == "api"));
        let e = route(&Method::POST, "/v1/backends/drain", None, b"{}", true)
            .err()
            .unwrap();
        assert_eq!(e.status, 400);
        let e = route(&Method::GET, "/v1/backends", None, b"", false)
            .err()
            .unwrap();
        assert_eq!(
            e.status, 404,
            "the TCP listener serves probes and metrics only"
        );
        assert!(route(&Method::GET, "/metrics", None, b"", false).is_ok());
    }

    /// The API socket appears at its path only whole, with mode 0600: never created there
    /// (then chmod'ed) but renamed in, replacing an old one.
    #[tokio::test]
    async fn the_api_socket_appears_only_with_its_mode() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("lb-api-sock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lbd.sock");
        std::fs::write(&path, "an old socket").unwrap();
        // Every file created in the directory, from before the bind (read after it).
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        assert!(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE) } >= 0);
        let task = tokio::spawn(serve_unix(path.clone(), Arc::new(Ok200)));
        let meta = loop {
            if let Ok(m) = std::fs::metadata(&path)
                && m.file_type().is_socket()
            {
                break m;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let mut buf = [0u8; 4096];
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        unsafe { libc::close(fd) };
        let created = crate::config_watch::parse_events(&buf[..n.max(0) as usize]);
        task.abort();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            !created
                .iter()
                .any(|n| n.as_deref() == Some("lbd.sock".as_ref())),
            "the socket was created at its path, then chmod'ed: {created:?}"
        );
    }

    struct Ok200;

    impl Handler for Ok200 {
        async fn handle(self: &Arc<Self>, _req: Request) -> Response {
            Response::text(200, "ok\n".into())
        }
    }

    /// One plain GET /healthz on a fresh connection: the status line, or None.
    async fn healthz(addr: std::net::SocketAddr) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.ok()?;
        String::from_utf8_lossy(&out)
            .lines()
            .next()
            .map(str::to_owned)
    }

    #[tokio::test]
    async fn slow_and_huge_requests_do_not_hurt_the_listener() {
        use std::time::{Duration, Instant};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            max_connections: 8,
            ..Limits::TCP
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_tcp_on(listener, Arc::new(Ok200), limits));
        assert_eq!(healthz(addr).await.as_deref(), Some("HTTP/1.1 200 OK"));

        // Slow clients: more than the cap, each sending half a header and stalling. Over the
        // cap they are closed at once; the others are cut off by the header read timeout.
        let mut slow = Vec::new();
        for _ in 0..32 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
                .await
                .unwrap();
            slow.push(c);
        }
        let t = Instant::now();
        let mut answered = None;
        while t.elapsed() < Duration::from_secs(5) {
            if healthz(addr).await.as_deref() == Some("HTTP/1.1 200 OK") {
                answered = Some(t.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let took = answered.expect("the listener answers again while slow clients hang");
        assert!(took < Duration::from_secs(2), "answered after {took:?}");
        for mut c in slow {
            // Each slow client was closed by the daemon (EOF or reset), not left holding a slot.
            let mut buf = [0u8; 512];
            let r = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf)).await;
            assert!(r.is_ok(), "a stalled client is still held open");
        }

        // Huge headers: refused (431 or closed), never buffered without bound.
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let big = format!(
            "GET /healthz HTTP/1.1\r\nx-big: {}\r\n\r\n",
            "a".repeat(1 << 20)
        );
        let _ = c.write_all(big.as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut out)).await;
        let head = String::from_utf8_lossy(&out);
        assert!(!head.starts_with("HTTP/1.1 200"), "{head}");

        // A huge body: 413.
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = vec![b'x'; 1 << 20];
        let req = format!(
            "POST /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let _ = c.write_all(&body).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut out)).await;
        assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 413"),
            "{}",
            String::from_utf8_lossy(&out[..out.len().min(200)])
        );
        assert_eq!(healthz(addr).await.as_deref(), Some("HTTP/1.1 200 OK"));
    }

    #[tokio::test]
    async fn slow_bodies_are_cut_off_and_free_their_slot() {
        use std::time::{Duration, Instant};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A connection lifetime far longer than the test: only the body timeout can free the
        // slots.
        let limits = Limits {
            body_read_timeout: Duration::from_millis(300),
            connection_lifetime: Duration::from_secs(600),
            max_connections: 4,
            ..Limits::TCP
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_tcp_on(listener, Arc::new(Ok200), limits));
        // Every slot taken by a client that sends its headers and a tenth of its body.
        let mut slow = Vec::new();
        for _ in 0..4 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(
                b"POST /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
            )
            .await
            .unwrap();
            slow.push(c);
        }
        for mut c in slow {
            let mut out = Vec::new();
            let r = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
            assert!(r.is_ok(), "a trickling body still holds its slot");
            let head = String::from_utf8_lossy(&out);
            assert!(head.starts_with("HTTP/1.1 408"), "{head}");
        }
        let t = Instant::now();
        let mut ok = false;
        while t.elapsed() < Duration::from_secs(5) && !ok {
            ok = healthz(addr).await.as_deref() == Some("HTTP/1.1 200 OK");
        }
        assert!(ok, "the listener answers again");
    }
}
