//! The daemon's API: JSON over HTTP/1.1 on a unix socket (mode 0600), and an optional TCP
//! listener that serves only `/metrics`, `/healthz` and `/readyz`. This module is transport only:
//! it turns requests into [`Request`] values for a [`Handler`] and answers with its JSON.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

/// Body of drain/undrain requests.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DrainRequest {
    /// VIP name or address.
    pub vip: String,
    pub backend: std::net::IpAddr,
}

#[derive(Clone, Debug)]
pub enum Request {
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

fn route(method: &Method, path: &str, body: &[u8], full_api: bool) -> Result<Request, Response> {
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

async fn serve_conn<S, H>(io: S, handler: Arc<H>, full_api: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let handler = handler.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let resp = match route(&parts.method, parts.uri.path(), &body, full_api) {
                Ok(r) => handler.handle(r).await,
                Err(resp) => resp,
            };
            let mut out = hyper::Response::new(Full::new(Bytes::from(resp.body)));
            *out.status_mut() =
                StatusCode::from_u16(resp.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            out.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(resp.content_type),
            );
            Ok::<_, std::convert::Infallible>(out)
        }
    });
    if let Err(e) = http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await
    {
        tracing::debug!(error = %e, "API connection ended with an error");
    }
}

/// Serve the full API on a unix socket with mode 0600 (replacing a stale socket file).
pub async fn serve_unix<H: Handler>(path: std::path::PathBuf, handler: Arc<H>) -> Result<()> {
    let path = path.as_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(path);
    let listener =
        tokio::net::UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(serve_conn(stream, handler.clone(), true));
    }
}

/// Serve only /metrics, /healthz and /readyz on TCP (for probes and Prometheus).
pub async fn serve_tcp<H: Handler>(addr: std::net::SocketAddr, handler: Arc<H>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind {addr}"))?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(serve_conn(stream, handler.clone(), false));
    }
}

/// The client `lbctl` uses.
pub struct Client {
    socket: std::path::PathBuf,
}

impl Client {
    pub fn new(socket: impl Into<std::path::PathBuf>) -> Self {
        Client {
            socket: socket.into(),
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<serde_json::Value> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .with_context(|| {
                format!(
                    "connect to lbd at {} (is lbd running? see --socket)",
                    self.socket.display()
                )
            })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "lbd")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).to_string();
        if !status.is_success() {
            let msg = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or(text);
            bail!("lbd answered {status}: {msg}");
        }
        if path == "/metrics" {
            return Ok(serde_json::Value::String(text));
        }
        serde_json::from_str(&text).with_context(|| format!("lbd's answer to {path} is not JSON"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = route(&Method::GET, "/v1/backends", b"", true).ok().unwrap();
        assert!(matches!(r, Request::Backends));
        let r = route(
            &Method::POST,
            "/v1/backends/drain",
            br#"{"vip":"api","backend":"10.0.0.1"}"#,
            true,
        )
        .ok()
        .unwrap();
        assert!(matches!(r, Request::Drain(d) if d.vip == "api"));
        let e = route(&Method::POST, "/v1/backends/drain", b"{}", true)
            .err()
            .unwrap();
        assert_eq!(e.status, 400);
        let e = route(&Method::GET, "/v1/backends", b"", false)
            .err()
            .unwrap();
        assert_eq!(
            e.status, 404,
            "the TCP listener serves probes and metrics only"
        );
        assert!(route(&Method::GET, "/metrics", b"", false).is_ok());
    }
}
