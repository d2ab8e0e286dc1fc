//! Stand-in backends for health-check tests, load tests and the demo.
//!
//! ```text
//! standin https   --listen ADDR:PORT --id NAME [--ready-file PATH]   # self-signed TLS
//! standin http    --listen ADDR:PORT --id NAME [--ready-file PATH]
//! standin hang    --listen ADDR:PORT                                 # accepts, never answers
//! standin garbage --listen ADDR:PORT                                 # accepts, writes junk, closes
//! ```
//!
//! `https`/`http`: `GET /readyz` and `/healthz` answer 200 `ok` while the ready file exists
//! (always, without `--ready-file`) and 500 otherwise, so a test makes a backend unready with
//! `rm` and ready again with `touch`. Any other path answers 200 with `<id>\n`, so a load test
//! sees which backend answered. Each prints `listening on ADDR` once bound (port 0 works) and
//! exits with status 0 on SIGTERM or SIGINT.

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
}

struct Backend {
    id_body: Bytes,
    ready_file: Option<PathBuf>,
}

impl Backend {
    fn ready(&self) -> bool {
        self.ready_file.as_ref().is_none_or(|p| p.exists())
    }

    fn answer(&self, path: &str) -> Response<Full<Bytes>> {
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
    let addr = match &cli.cmd {
        Cmd::Https(a) | Cmd::Http(a) => a.listen,
        Cmd::Hang(a) | Cmd::Garbage(a) => a.listen,
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
        let resp = backend.answer(req.uri().path());
        async move { Ok::<_, Infallible>(resp) }
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
