//! Stand-in backends for health-check tests, load tests and the demo.
//!
//! ```text
//! standin https   --listen ADDR:PORT --id NAME [--ready-file PATH]   # self-signed TLS
//! standin http    --listen ADDR:PORT --id NAME [--ready-file PATH]
//! standin hang    --listen ADDR:PORT                                 # accepts, never answers
//! standin garbage --listen ADDR:PORT                                 # accepts, writes junk, closes
//! standin get-many --target ADDR:PORT --count N [--tls] [--concurrency C] [--timeout-ms T]
//! standin stream   --target ADDR:PORT [--tls] [--concurrency C] [--pause-ms P]
//! ```
//!
//! `https`/`http`: `GET /readyz` and `/healthz` answer 200 `ok` while the ready file exists
//! (always, without `--ready-file`) and 500 otherwise, so a test makes a backend unready with
//! `rm` and ready again with `touch`. `--path-file PATH=FILE` (repeatable) gives PATH its own
//! file, answered the same way (a router's `/healthz` and `/healthz/ready` apart).
//! `--slow-file FILE`: while FILE exists, those health answers come only after the number of
//! milliseconds it holds (a cluster whose `/readyz` turns slow, not dead). Any other
//! path answers 200 with `<id>\n`, so a load test
//! sees which backend answered. Each prints `listening on ADDR` once bound (port 0 works) and
//! exits with status 0 on SIGTERM or SIGINT.
//!
//! Clients (for the labs): each request is a new connection (TLS without verification with
//! `--tls`) sending `GET /id` and reading the answer, i.e. which backend served it.
//! `get-many` makes COUNT requests, CONCURRENCY at a time, and prints JSON
//! `{"ok", "failed", "by_id", "errors", "elapsed_ms"}`. `stream` requests without end (until
//! SIGTERM/SIGINT) and prints one line per request, stamped with the Unix time in ms at which
//! its connection started: `<ms> <id>` or `<ms> ERR <reason>`.

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_rustls::TlsAcceptor;

#[derive(Parser)]
#[command(about = "Stand-in backends: HTTPS/HTTP with a readiness switch, hanging, garbage")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// HTTPS with a self-signed certificate made at startup.
    Https(ServeArgs),
    /// Plain HTTP.
    Http(ServeArgs),
    /// Accept connections and never answer.
    Hang(ListenArgs),
    /// Accept, write random bytes, close.
    Garbage(ListenArgs),
    /// Client: COUNT requests, one connection each; prints a JSON tally by backend id.
    GetMany(GetManyArgs),
    /// Client: requests until stopped; one line per request (`<unix ms> <id>|ERR <reason>`).
    Stream(StreamArgs),
}

#[derive(Args)]
struct ClientArgs {
    /// Where to connect (a VIP and port, or a proxy).
    #[arg(long)]
    target: SocketAddr,
    /// Speak TLS (no certificate verification).
    #[arg(long)]
    tls: bool,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Deadline of one request (connect, handshake, answer).
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
    #[arg(long, default_value = "/id")]
    path: String,
}

#[derive(Args)]
struct GetManyArgs {
    #[command(flatten)]
    client: ClientArgs,
    #[arg(long)]
    count: u64,
}

#[derive(Args)]
struct StreamArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Pause of each worker between its requests.
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
}

#[derive(Args)]
struct ListenArgs {
    #[arg(long)]
    listen: SocketAddr,
}

#[derive(Args)]
struct ServeArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// Name returned in the body of every non-health request.
    #[arg(long)]
    id: String,
    /// Ready while this file exists; always ready without it.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// `PATH=FILE`: PATH answers 200 while FILE exists, 500 otherwise.
    #[arg(long)]
    path_file: Vec<String>,
    /// While this file exists, health answers wait the milliseconds it holds.
    #[arg(long)]
    slow_file: Option<PathBuf>,
}

struct Backend {
    id_body: Bytes,
    ready_file: Option<PathBuf>,
    path_files: Vec<(String, PathBuf)>,
    slow_file: Option<PathBuf>,
}

impl Backend {
    /// How long a health answer waits now (see `--slow-file`).
    fn delay(&self, path: &str) -> Duration {
        let health = matches!(path, "/readyz" | "/healthz")
            || self.path_files.iter().any(|(p, _)| p == path);
        let ms = self
            .slow_file
            .as_ref()
            .filter(|_| health)
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Duration::from_millis(ms)
    }

    fn ready(&self) -> bool {
        self.ready_file.as_ref().is_none_or(|p| p.exists())
    }

    fn answer(&self, path: &str) -> Response<Full<Bytes>> {
        if let Some((_, file)) = self.path_files.iter().find(|(p, _)| p == path) {
            let (status, body) = if file.exists() {
                (StatusCode::OK, "ok")
            } else {
                (StatusCode::INTERNAL_SERVER_ERROR, "failing")
            };
            let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
            *resp.status_mut() = status;
            return resp;
        }
        let (status, body) = match path {
            "/readyz" | "/healthz" if self.ready() => (StatusCode::OK, Bytes::from_static(b"ok")),
            "/readyz" | "/healthz" => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Bytes::from_static(b"not ready"),
            ),
            _ => (StatusCode::OK, self.id_body.clone()),
        };
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() = status;
        resp
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let addr = match cli.cmd {
        Cmd::Https(ref a) | Cmd::Http(ref a) => a.listen,
        Cmd::Hang(ref a) | Cmd::Garbage(ref a) => a.listen,
        Cmd::GetMany(a) => return get_many(a).await,
        Cmd::Stream(a) => return stream(a).await,
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    println!("listening on {}", listener.local_addr()?);

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let serve = async move {
        match cli.cmd {
            Cmd::Https(a) => serve_http(listener, a, Some(tls_acceptor()?)).await,
            Cmd::Http(a) => serve_http(listener, a, None).await,
            Cmd::Hang(_) => accept_loop(listener, hang).await,
            Cmd::Garbage(_) => accept_loop(listener, garbage).await,
            Cmd::GetMany(_) | Cmd::Stream(_) => unreachable!("clients return above"),
        }
    };
    tokio::select! {
        r = serve => r,
        // Open connections simply end with the process: that is what a killed backend does.
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}

fn tls_acceptor() -> Result<TlsAcceptor> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accept forever, one task per connection. Accept errors (e.g. out of file descriptors) are
/// reported and retried after a pause rather than ending the server.
async fn accept_loop<F, Fut>(listener: TcpListener, handle: F) -> Result<()>
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                tokio::spawn(handle(s));
            }
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_http(
    listener: TcpListener,
    args: ServeArgs,
    tls: Option<TlsAcceptor>,
) -> Result<()> {
    let backend = Arc::new(Backend {
        id_body: Bytes::from(format!("{}\n", args.id)),
        ready_file: args.ready_file,
        path_files: args
            .path_file
            .iter()
            .map(|pf| {
                let (p, f) = pf
                    .split_once('=')
                    .with_context(|| format!("--path-file {pf:?}: PATH=FILE"))?;
                Ok((p.to_string(), PathBuf::from(f)))
            })
            .collect::<Result<_>>()?,
        slow_file: args.slow_file,
    });
    accept_loop(listener, move |s| {
        let backend = backend.clone();
        let tls = tls.clone();
        async move {
            match tls {
                Some(acceptor) => {
                    // A client that never finishes its handshake must not hold a task forever.
                    let hs = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(s));
                    if let Ok(Ok(stream)) = hs.await {
                        serve_conn(stream, backend).await;
                    }
                }
                None => serve_conn(s, backend).await,
            }
        }
    })
    .await
}

async fn serve_conn<S>(stream: S, backend: Arc<Backend>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let path = req.uri().path().to_string();
        let delay = backend.delay(&path);
        let resp = backend.answer(&path);
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, Infallible>(resp)
        }
    });
    // Errors here are clients going away mid-request: nothing to do about them.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Hold the connection, read and drop whatever comes, never answer; end when the client does.
async fn hang(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// Write 16-1024 random bytes, then close.
async fn garbage(mut s: TcpStream) {
    let mut seed = RandomState::new().hash_one(std::time::Instant::now()) | 1;
    let len = 16 + (seed % 1009) as usize;
    let junk: Vec<u8> = (0..len)
        .map(|_| {
            // xorshift64: plenty random for junk, no dependency.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let _ = s.write_all(&junk).await;
    let _ = s.shutdown().await;
    // Drain briefly so the close is a FIN, not a reset over the client's unread request.
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// What a client needs for every request.
#[derive(Clone)]
struct Requester {
    target: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: Duration,
    request: Arc<Vec<u8>>,
}

impl Requester {
    fn new(a: &ClientArgs) -> Self {
        let tls = a.tls.then(|| {
            tokio_rustls::TlsConnector::from(lb_userspace::health::probe::tls_client_config())
        });
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            a.path, a.target
        );
        Self {
            target: a.target,
            tls,
            timeout: Duration::from_millis(a.timeout_ms),
            request: Arc::new(request.into_bytes()),
        }
    }

    /// One request on a new connection: the id the backend answered, or why it failed; and the
    /// connection's local port, once it connected.
    async fn one(&self) -> (Result<String, String>, Option<u16>) {
        let mut port = None;
        let work = async {
            let tcp = TcpStream::connect(self.target)
                .await
                .map_err(|e| format!("connect: {}", e.kind()))?;
            port = tcp.local_addr().ok().map(|a| a.port());
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                Some(c) => {
                    let name = rustls::pki_types::ServerName::IpAddress(self.target.ip().into());
                    let s = c
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("tls: {}", e.kind()))?;
                    exchange(s, &self.request).await
                }
                None => exchange(tcp, &self.request).await,
            }
        };
        let r = match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err("timeout".into()),
        };
        (r, port)
    }
}

/// Send `request`, read one response (status line, headers, `Content-Length` body) and return
/// the body's first line when the status is 200.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    request: &[u8],
) -> Result<String, String> {
    s.write_all(request)
        .await
        .map_err(|e| format!("write: {}", e.kind()))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse::<u16>().ok())
                .ok_or_else(|| "garbage status line".to_string())?;
            let len = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .ok_or_else(|| "no content-length".to_string())?;
            let body_start = end + 4;
            if buf.len() >= body_start + len {
                if status != 200 {
                    return Err(format!("status {status}"));
                }
                let body = String::from_utf8_lossy(&buf[body_start..body_start + len]);
                return Ok(body.lines().next().unwrap_or("").trim().to_string());
            }
        }
        if buf.len() > 64 * 1024 {
            return Err("response too long".into());
        }
        let n = s
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {}", e.kind()))?;
        if n == 0 {
            return Err("closed before the whole response".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

async fn get_many(a: GetManyArgs) -> Result<()> {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    #[derive(Default)]
    struct Tally {
        ok: u64,
        failed: u64,
        by_id: BTreeMap<String, u64>,
        errors: BTreeMap<String, u64>,
    }
    let req = Requester::new(&a.client);
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let next = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..a.client.concurrency.max(1))
        .map(|_| {
            let (req, tally, next) = (req.clone(), tally.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < a.count {
                    let (r, _) = req.one().await;
                    let mut t = tally.lock().unwrap();
                    match r {
                        Ok(id) => {
                            t.ok += 1;
                            *t.by_id.entry(id).or_default() += 1;
                        }
                        Err(e) => {
                            t.failed += 1;
                            *t.errors.entry(e).or_default() += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    let t = tally.lock().unwrap();
    let doc = serde_json::json!({
        "ok": t.ok,
        "failed": t.failed,
        "by_id": t.by_id,
        "errors": t.errors,
        "elapsed_ms": started.elapsed().as_millis() as u64,
    });
    println!("{doc}");
    Ok(())
}

async fn stream(a: StreamArgs) -> Result<()> {
    let req = Requester::new(&a.client);
    let pause = Duration::from_millis(a.pause_ms);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let workers: Vec<_> = (0..a.client.concurrency.max(1))
        .map(|_| {
            let req = req.clone();
            tokio::spawn(async move {
                loop {
                    let at = unix_ms();
                    let line = match req.one().await {
                        (Ok(id), Some(port)) => format!("{at} {id} port {port}"),
                        (Ok(id), None) => format!("{at} {id}"),
                        (Err(e), _) => format!("{at} ERR {e}"),
                    };
                    // One write per line so concurrent workers never interleave within a line.
                    {
                        use std::io::Write;
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "{line}");
                        let _ = out.flush();
                    }
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            })
        })
        .collect();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    for w in workers {
        w.abort();
    }
    Ok(())
}
