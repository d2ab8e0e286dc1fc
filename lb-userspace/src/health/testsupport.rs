//! In-process stand-in backends on 127.0.0.1 for the health tests: HTTPS and HTTP servers with
//! a readiness switch, one that hangs, one that speaks garbage. Each stops when dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

pub struct TestServer {
    pub addr: SocketAddr,
    /// `/readyz` and `/healthz` answer 200 while set, 500 otherwise.
    pub ready: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // The accept task owns every connection, so this closes them all.
        self.task.abort();
    }
}

impl TestServer {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

/// A port nothing listens on (bound, then released).
pub async fn closed_port() -> SocketAddr {
    listener().await.1
}

fn tls_acceptor() -> TlsAcceptor {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

/// Answer one request per connection, by path and the ready flag.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, ready: &AtomicBool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let line = String::from_utf8_lossy(&buf);
    let path = line.split(' ').nth(1).unwrap_or("");
    let up = !matches!(path, "/readyz" | "/healthz") || ready.load(Ordering::SeqCst);
    let resp: &[u8] = if up {
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
    } else {
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 9\r\nConnection: close\r\n\r\nunready!\n"
    };
    let _ = s.write_all(resp).await;
    let _ = s.shutdown().await;
}

async fn serve(tls: bool) -> TestServer {
    let (l, addr) = listener().await;
    let ready = Arc::new(AtomicBool::new(true));
    let flag = ready.clone();
    let acceptor = tls.then(tls_acceptor);
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let flag = flag.clone();
            let acceptor = acceptor.clone();
            conns.spawn(async move {
                match acceptor {
                    Some(a) => {
                        if let Ok(tls) = a.accept(s).await {
                            answer(tls, &flag).await;
                        }
                    }
                    None => answer(s, &flag).await,
                }
            });
            while conns.try_join_next().is_some() {}
        }
    });
    TestServer { addr, ready, task }
}

pub async fn https_server() -> TestServer {
    serve(true).await
}

pub async fn http_server() -> TestServer {
    serve(false).await
}

/// Accepts and never says a word; holds every connection open.
pub async fn hang_server() -> TestServer {
    let (l, addr) = listener().await;
    let task = tokio::spawn(async move {
        let mut held: Vec<TcpStream> = Vec::new();
        loop {
            if let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        }
    });
    TestServer {
        addr,
        ready: Arc::new(AtomicBool::new(true)),
        task,
    }
}

/// Accepts, writes junk, closes.
pub async fn garbage_server() -> TestServer {
    let (l, addr) = listener().await;
    let task = tokio::spawn(async move {
        loop {
            if let Ok((mut s, _)) = l.accept().await {
                let _ = s
                    .write_all(b"\x00\xffjunk\x13\x37 not http at all\r\n\r\n")
                    .await;
                let _ = s.shutdown().await;
            }
        }
    });
    TestServer {
        addr,
        ready: Arc::new(AtomicBool::new(true)),
        task,
    }
}
