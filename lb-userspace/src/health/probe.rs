//! One health probe: TCP connect, optionally TLS, `GET path` through hyper's HTTP/1.1 client
//! connection, judge the status. One deadline covers all of it, so a slow, hanging or
//! garbage-speaking backend costs at most `timeout_ms` of its own task's time and nothing of
//! anyone else's.
//!
//! The response is judged on its status alone; the body is never read, and the connection is
//! dropped right after (the request says `Connection: close`).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Empty;
use hyper::{body::Bytes, client::conn::http1};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use super::config::{CheckKind, HealthConfig, StatusRange};

/// Where a probe was when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Tls,
    Request,
    Response,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Connect => "connect",
            Stage::Tls => "tls handshake",
            Stage::Request => "request",
            Stage::Response => "response",
        })
    }
}

/// Why a probe failed. The `Display` text is what operators see as the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeFailure {
    #[error("connection refused")]
    Refused,
    /// The backend reset the connection (its process died mid-check, or it refuses us).
    #[error("connection reset during {0}")]
    Reset(Stage),
    /// The routed backend's `lbd decap` does not answer on its health port.
    #[error("lbd decap not answering at {0}")]
    Gate(String),
    #[error("connect failed: {0}")]
    Connect(String),
    #[error("timeout after {after_ms} ms during {stage}")]
    Timeout { stage: Stage, after_ms: u64 },
    #[error("tls error: {0}")]
    Tls(String),
    #[error("{stage} failed: {error}")]
    Io { stage: Stage, error: String },
    #[error("bad status {0}")]
    BadStatus(u16),
    #[error("garbage response: {0}")]
    Garbage(String),
    #[error("connection closed before the status line")]
    Closed,
}

/// What kind of failure a probe result is, as far as the load balancer's decisions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// The probe passed.
    #[default]
    None,
    /// Slow or wrong: a timeout, a bad status, garbage, a TLS error. It may be the whole
    /// cluster having a bad moment (an etcd latency spike slows every `/readyz`), so it counts
    /// towards `fall` and may fail open.
    Soft,
    /// Nothing listens: the process is gone (or, with `absent_when_refused`, was never there).
    Refused,
    /// The backend reset the connection.
    Reset,
}

impl FailureClass {
    /// A refusal or a reset: the backend itself said no, so there is nothing to wait for and
    /// nothing to fail open to (see `Tracker::record_hard_failure` and `plan`).
    pub fn is_hard(self) -> bool {
        matches!(self, FailureClass::Refused | FailureClass::Reset)
    }
}

impl ProbeFailure {
    pub fn class(&self) -> FailureClass {
        match self {
            ProbeFailure::Refused => FailureClass::Refused,
            ProbeFailure::Reset(_) => FailureClass::Reset,
            _ => FailureClass::Soft,
        }
    }
}

/// Whether an error, or one it wraps, is a connection reset.
fn is_reset(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>()
            && matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Everything one probe needs, resolved once per config so each run allocates little.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub kind: CheckKind,
    /// The address probed: the target's IP with `HealthConfig::port` if set.
    pub addr: SocketAddr,
    pub timeout: Duration,
    pub expect: StatusRange,
    /// The request's path and `Host` header for `http`/`https`.
    path: String,
    host: String,
    /// Name sent as TLS SNI; `None` sends none (rustls never sends an IP address as SNI).
    sni: Option<ServerName<'static>>,
    /// See `Target::gate`: connected to first, within the same timeout.
    gate: Option<SocketAddr>,
}

impl ProbeSpec {
    /// `target` is the backend's address with the service port; `sni` (if any) is sent as TLS
    /// server name and as the `Host` header (the default `Host` is the probed address).
    pub fn new(target: SocketAddr, cfg: &HealthConfig, sni: Option<&str>) -> Self {
        let addr = SocketAddr::new(target.ip(), cfg.port.unwrap_or(target.port()));
        // A name rustls refuses (e.g. with spaces) is not sent: the check itself still works.
        let sni = sni.and_then(|s| ServerName::try_from(s.to_string()).ok());
        let host = match &sni {
            Some(ServerName::DnsName(n)) => format!("{}:{}", n.as_ref(), addr.port()),
            _ => addr.to_string(),
        };
        Self {
            kind: cfg.kind,
            addr,
            timeout: Duration::from_millis(cfg.timeout_ms),
            expect: cfg.expect_status,
            path: cfg.path.clone(),
            host,
            sni,
            gate: None,
        }
    }

    pub fn with_gate(mut self, gate: Option<SocketAddr>) -> Self {
        self.gate = gate;
        self
    }

    /// Run the probe once. Never takes (much) longer than `timeout`.
    pub async fn run(&self) -> Result<(), ProbeFailure> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        if let Some(gate) = self.gate {
            match within(deadline, started, Stage::Connect, TcpStream::connect(gate)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(ProbeFailure::Gate(format!("{gate}: {e}"))),
                Err(_) => return Err(ProbeFailure::Gate(format!("{gate}: no answer"))),
            }
        }
        let connect = TcpStream::connect(self.addr);
        let tcp = match within(deadline, started, Stage::Connect, connect).await? {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(ProbeFailure::Refused);
            }
            Err(e) if is_reset(&e) => return Err(ProbeFailure::Reset(Stage::Connect)),
            Err(e) => return Err(ProbeFailure::Connect(e.to_string())),
        };
        // Small request, answer awaited at once: do not let Nagle hold it back.
        let _ = tcp.set_nodelay(true);
        match self.kind {
            CheckKind::Tcp | CheckKind::None => Ok(()),
            CheckKind::Http => self.exchange(tcp, deadline, started).await,
            CheckKind::Https => {
                let name = self
                    .sni
                    .clone()
                    .unwrap_or_else(|| ServerName::IpAddress(self.addr.ip().into()));
                let connector = TlsConnector::from(tls_client_config());
                let handshake = connector.connect(name, tcp);
                let tls = within(deadline, started, Stage::Tls, handshake)
                    .await?
                    .map_err(|e| {
                        if is_reset(&e) {
                            ProbeFailure::Reset(Stage::Tls)
                        } else {
                            ProbeFailure::Tls(e.to_string())
                        }
                    })?;
                self.exchange(tls, deadline, started).await
            }
        }
    }

    /// The request hyper sends.
    fn request(&self) -> Result<hyper::Request<Empty<Bytes>>, ProbeFailure> {
        hyper::Request::get(self.path.as_str())
            .header(hyper::header::HOST, self.host.as_str())
            .header(
                hyper::header::USER_AGENT,
                concat!("lb-health/", env!("CARGO_PKG_VERSION")),
            )
            .header(hyper::header::ACCEPT, "*/*")
            .header(hyper::header::CONNECTION, "close")
            .body(Empty::new())
            .map_err(|e| ProbeFailure::Io {
                stage: Stage::Request,
                error: e.to_string(),
            })
    }

    async fn exchange<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
        &self,
        s: S,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), ProbeFailure> {
        let request = self.request()?;
        let (mut sender, conn) = within(
            deadline,
            started,
            Stage::Request,
            http1::handshake::<_, Empty<Bytes>>(TokioIo::new(s)),
        )
        .await?
        .map_err(|e| {
            if is_reset(&e) {
                ProbeFailure::Reset(Stage::Request)
            } else {
                ProbeFailure::Io {
                    stage: Stage::Request,
                    error: e.to_string(),
                }
            }
        })?;
        // The connection is driven here, not spawned: it ends with the probe (dropped at the
        // deadline or after the status), so a hanging backend leaves nothing running.
        let mut conn = std::pin::pin!(conn);
        let exchange = async {
            let resp = sender.send_request(request);
            let mut resp = std::pin::pin!(resp);
            let r = tokio::select! {
                biased;
                r = &mut resp => r,
                r = &mut conn => match r {
                    Err(e) => Err(e),
                    // The connection is done (`Connection: close`): the answer, if any, is
                    // already in; without one this is an error.
                    Ok(()) => resp.await,
                },
            };
            r.map(|r| r.status().as_u16()).map_err(|e| failure(&e))
        };
        let status = within(deadline, started, Stage::Response, exchange).await??;
        if self.expect.contains(status) {
            Ok(())
        } else {
            Err(ProbeFailure::BadStatus(status))
        }
    }
}

/// What hyper's error means for the operator.
fn failure(e: &hyper::Error) -> ProbeFailure {
    if is_reset(e) {
        ProbeFailure::Reset(Stage::Response)
    } else if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        ProbeFailure::Garbage(e.to_string())
    } else if e.is_incomplete_message() || e.is_canceled() {
        ProbeFailure::Closed
    } else {
        ProbeFailure::Io {
            stage: Stage::Response,
            error: e.to_string(),
        }
    }
}

/// Run `fut` unless the probe's deadline passes first.
async fn within<T>(
    deadline: Instant,
    started: Instant,
    stage: Stage,
    fut: impl Future<Output = T>,
) -> Result<T, ProbeFailure> {
    timeout_at(deadline, fut)
        .await
        .map_err(|_| ProbeFailure::Timeout {
            stage,
            after_ms: started.elapsed().as_millis() as u64,
        })
}

/// The TLS client settings shared by every HTTPS probe: no certificate verification (health
/// checks reach backends by IP, and backends like kube-apiserver present certificates for
/// names), TLS 1.2 and 1.3, no client certificate. Built once.
pub fn tls_client_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                // The ring provider supports the default versions: this cannot fail.
                .expect("ring provider supports TLS 1.2 and 1.3")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Accepts any certificate, like haproxy's `verify none`. Handshake signatures are still
/// checked against the presented certificate's key, as OpenSSL does under `verify none`: it
/// costs little and rejects peers that cannot complete a real handshake.
#[derive(Debug)]
struct AcceptAnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_uses_the_check_port_and_builds_a_request() {
        let cfg = HealthConfig {
            port: Some(1936),
            ..HealthConfig::http("/healthz")
        };
        let spec = ProbeSpec::new("10.0.0.5:80".parse().unwrap(), &cfg, None);
        assert_eq!(spec.addr, "10.0.0.5:1936".parse().unwrap());
        let req = spec.request().unwrap();
        assert_eq!(req.uri().path(), "/healthz");
        assert_eq!(req.headers()["host"], "10.0.0.5:1936");
        assert_eq!(req.headers()["connection"], "close");

        let spec = ProbeSpec::new(
            "[::1]:6443".parse().unwrap(),
            &HealthConfig::default(),
            Some("api.example"),
        );
        assert_eq!(
            spec.request().unwrap().headers()["host"],
            "api.example:6443"
        );
    }

    #[test]
    fn tls_config_builds() {
        let c = tls_client_config();
        assert!(Arc::ptr_eq(&c, &tls_client_config()));
    }
}
