//! One health probe: TCP connect, optionally TLS, `GET path`, read the status line. One
//! deadline covers all of it, so a slow, hanging or garbage-speaking backend costs at most
//! `timeout_ms` of its own task's time and nothing of anyone else's.
//!
//! The response is judged on its status line alone; the body is never read, and the connection
//! is dropped right after (the request says `Connection: close`).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use super::config::{CheckKind, HealthConfig, StatusRange};

/// Longest status line accepted; real ones are ~20 bytes.
const MAX_STATUS_LINE: usize = 512;

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

/// Everything one probe needs, resolved once per config so each run allocates little.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub kind: CheckKind,
    /// The address probed: the target's IP with `HealthConfig::port` if set.
    pub addr: SocketAddr,
    pub timeout: Duration,
    pub expect: StatusRange,
    /// The request bytes for `http`/`https`.
    request: Vec<u8>,
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
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: lb-health/{}\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n",
            cfg.path,
            env!("CARGO_PKG_VERSION"),
        )
        .into_bytes();
        Self {
            kind: cfg.kind,
            addr,
            timeout: Duration::from_millis(cfg.timeout_ms),
            expect: cfg.expect_status,
            request,
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
                    .map_err(|e| ProbeFailure::Tls(e.to_string()))?;
                self.exchange(tls, deadline, started).await
            }
        }
    }

    async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut s: S,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), ProbeFailure> {
        let io_err = |stage| {
            move |e: io::Error| ProbeFailure::Io {
                stage,
                error: e.to_string(),
            }
        };
        within(deadline, started, Stage::Request, async {
            s.write_all(&self.request).await?;
            s.flush().await
        })
        .await?
        .map_err(io_err(Stage::Request))?;
        let status = within(deadline, started, Stage::Response, read_status(&mut s))
            .await?
            .map_err(|e| match e {
                ReadError::Io(e) => io_err(Stage::Response)(e),
                ReadError::Probe(p) => p,
            })?;
        if self.expect.contains(status) {
            Ok(())
        } else {
            Err(ProbeFailure::BadStatus(status))
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

enum ReadError {
    Io(io::Error),
    Probe(ProbeFailure),
}

/// Read until the end of the status line (or enough to tell it is not one) and parse it.
async fn read_status<S: AsyncRead + Unpin>(s: &mut S) -> Result<u16, ReadError> {
    let mut buf = [0u8; MAX_STATUS_LINE];
    let mut len = 0;
    loop {
        let n = s.read(&mut buf[len..]).await.map_err(ReadError::Io)?;
        let eof = n == 0;
        len += n;
        let got = &buf[..len];
        // Reject early: a peer speaking something else shows it in its first bytes.
        if !b"HTTP/".starts_with(&got[..got.len().min(5)]) {
            return Err(ReadError::Probe(garbage(got)));
        }
        if let Some(end) = got.iter().position(|&b| b == b'\n') {
            return parse_status_line(&got[..end]).map_err(ReadError::Probe);
        }
        if eof {
            return Err(ReadError::Probe(if len == 0 {
                ProbeFailure::Closed
            } else {
                garbage(got)
            }));
        }
        if len == buf.len() {
            return Err(ReadError::Probe(garbage(got)));
        }
    }
}

/// The first bytes of a bad answer, escaped, for the failure reason.
fn garbage(got: &[u8]) -> ProbeFailure {
    let shown = &got[..got.len().min(32)];
    ProbeFailure::Garbage(format!("{:?}", shown.escape_ascii().to_string()))
}

/// Parse `HTTP/1.x NNN reason` (the line without its `\n`) into the status code.
pub fn parse_status_line(line: &[u8]) -> Result<u16, ProbeFailure> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let bad = || garbage(line);
    let rest = line.strip_prefix(b"HTTP/").ok_or_else(bad)?;
    let sp = rest.iter().position(|&b| b == b' ').ok_or_else(bad)?;
    let (version, rest) = (&rest[..sp], &rest[sp + 1..]);
    if version.is_empty() || !version.iter().all(|b| b.is_ascii_digit() || *b == b'.') {
        return Err(bad());
    }
    let code = rest.get(..3).ok_or_else(bad)?;
    if !code.iter().all(u8::is_ascii_digit) || rest.get(3).is_some_and(|&b| b != b' ') {
        return Err(bad());
    }
    let status = code
        .iter()
        .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    if !(100..=599).contains(&status) {
        return Err(bad());
    }
    Ok(status)
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
    fn status_lines() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r"), Ok(200));
        assert_eq!(
            parse_status_line(b"HTTP/1.0 503 Service Unavailable"),
            Ok(503)
        );
        assert_eq!(parse_status_line(b"HTTP/1.1 204"), Ok(204));
        assert_eq!(parse_status_line(b"HTTP/2 302 Found"), Ok(302));
        for bad in [
            &b""[..],
            b"HTTP/1.1",
            b"HTTP/1.1 ",
            b"HTTP/1.1 20",
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1 abc OK",
            b"HTTP/1.1 099 x",
            b"HTTP/x.y 200 OK",
            b"SSH-2.0-OpenSSH_9.6",
            b"\x16\x03\x01\x00",
        ] {
            assert!(
                matches!(parse_status_line(bad), Err(ProbeFailure::Garbage(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn spec_uses_the_check_port_and_builds_a_request() {
        let cfg = HealthConfig {
            port: Some(1936),
            ..HealthConfig::http("/healthz")
        };
        let spec = ProbeSpec::new("10.0.0.5:80".parse().unwrap(), &cfg, None);
        assert_eq!(spec.addr, "10.0.0.5:1936".parse().unwrap());
        let req = String::from_utf8(spec.request.clone()).unwrap();
        assert!(req.starts_with("GET /healthz HTTP/1.1\r\nHost: 10.0.0.5:1936\r\n"));
        assert!(req.ends_with("Connection: close\r\n\r\n"));

        let spec = ProbeSpec::new(
            "[::1]:6443".parse().unwrap(),
            &HealthConfig::default(),
            Some("api.example"),
        );
        let req = String::from_utf8(spec.request.clone()).unwrap();
        assert!(req.contains("Host: api.example:6443\r\n"), "{req}");
    }

    #[test]
    fn tls_config_builds() {
        let c = tls_client_config();
        assert!(Arc::ptr_eq(&c, &tls_client_config()));
    }
}
