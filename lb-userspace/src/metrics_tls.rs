//! The /metrics listener cluster monitoring scrapes: HTTPS with client-certificate
//! authentication and a static allow list, served by lbd itself (docs/metrics.md, *Cluster
//! monitoring*).
//!
//! Why lbd and not a kube-rbac-proxy sidecar: a static pod has no service account, so the proxy
//! would need a kubeconfig, and the only one on the node is the kubelet's (the node's own
//! credentials, in a second container). Its checks would then call the API server through the
//! very VIP lbd provides, so scraping would fail exactly when the VIP does. The files used here
//! are the ones the kubelet already serves and authenticates with, and OpenShift rotates them:
//!
//! - the serving certificate and key: the kubelet's (`/var/lib/kubelet/pki/kubelet-server-current.pem`,
//!   a symlink the kubelet moves to each renewed certificate), issued for the node's name and
//!   addresses by the kubelet-serving CA, which Prometheus already trusts for the kubelet;
//! - the client CA: the kubelet's (`/etc/kubernetes/kubelet-ca.crt`, kept current by the
//!   machine-config daemon), which signs the client certificate Prometheus shows the kubelet;
//! - authorization: the client certificate's subject common name (the Kubernetes user name of
//!   an x509 client) must be in `allowed_clients`; a verified client outside it gets 403.
//!
//! Each new connection uses the files as they are: when a file's identity (inode, size,
//! modification time) changes, they are read again; a set that does not load (a rotation half
//! written) is logged and the last good one kept.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use crate::api::{Handler, Limits, Request, Response};
use anyhow::{Context, Result, anyhow, bail};
pub use lb_core::config::metrics_tls::{MetricsTlsConfig, PROMETHEUS_K8S};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};

/// What identifies a file's contents without reading it: a rotation changes one of these.
type Stamp = Vec<Option<(u64, u64, SystemTime)>>;

fn stamp(paths: &[&Path]) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p).ok().map(|m| {
                (
                    m.ino(),
                    m.len(),
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                )
            })
        })
        .collect()
}

/// The rustls server config from the files: the served chain and key, and a verifier that
/// requires a client certificate chaining to the client CA.
pub fn load(cfg: &MetricsTlsConfig) -> Result<Arc<ServerConfig>> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("read {}", p.display()));
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(&cfg.cert_file)?)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("cert_file {}: {e:?}", cfg.cert_file.display()))?;
    if certs.is_empty() {
        bail!("cert_file {}: no certificate", cfg.cert_file.display());
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&cfg.key_file)?)
        .map_err(|e| anyhow!("key_file {}: {e:?}", cfg.key_file.display()))?;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&read(&cfg.client_ca_file)?) {
        let c = c.map_err(|e| anyhow!("client_ca_file {}: {e:?}", cfg.client_ca_file.display()))?;
        roots
            .add(c)
            .with_context(|| format!("client_ca_file {}", cfg.client_ca_file.display()))?;
    }
    if roots.is_empty() {
        bail!(
            "client_ca_file {}: no certificate",
            cfg.client_ca_file.display()
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("client_ca_file")?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("cert_file and key_file do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server config of the files as they are now, read again when they change.
pub struct Reloader {
    cfg: MetricsTlsConfig,
    current: Mutex<Option<(Stamp, Arc<ServerConfig>)>>,
}

impl Reloader {
    pub fn new(cfg: MetricsTlsConfig) -> Self {
        Reloader {
            cfg,
            current: Mutex::new(None),
        }
    }

    /// The config for a new connection; an error only while no set of files ever loaded.
    pub fn config(&self) -> Result<Arc<ServerConfig>> {
        let now = stamp(&[
            &self.cfg.cert_file,
            &self.cfg.key_file,
            &self.cfg.client_ca_file,
        ]);
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, c)) = cur.as_ref()
            && *s == now
        {
            return Ok(c.clone());
        }
        match load(&self.cfg) {
            Ok(c) => {
                if cur.is_some() {
                    tracing::info!("metrics TLS: certificate files changed; loaded again");
                }
                *cur = Some((now, c.clone()));
                Ok(c)
            }
            Err(e) => match cur.as_mut() {
                Some((s, c)) => {
                    tracing::warn!(error = %format!("{e:#}"), "metrics TLS: changed files do not load; keeping the last good ones");
                    // Not retried on every connection until the files change again.
                    *s = now;
                    Ok(c.clone())
                }
                None => Err(e),
            },
        }
    }
}

/// The Kubernetes user name of an x509 client: its certificate's subject common name.
pub fn client_user(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    c.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// Whether a verified client whose chain starts with `certs` may read the metrics.
pub fn authorized(
    certs: Option<&[CertificateDer<'_>]>,
    allowed: &[String],
) -> Result<String, String> {
    let user = certs
        .and_then(|c| c.first())
        .and_then(client_user)
        .ok_or_else(|| "a client certificate without a common name".to_string())?;
    if allowed.contains(&user) {
        Ok(user)
    } else {
        Err(user)
    }
}

/// Answers every request of a client outside the allow list with 403.
struct Forbidden(String);

impl Handler for Forbidden {
    async fn handle(self: &Arc<Self>, _req: Request) -> Response {
        Response::error(
            403,
            format!(
                "{}: not allowed to read metrics (metrics_tls.allowed_clients)",
                self.0
            ),
        )
    }
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve /metrics (and /healthz, /readyz) over HTTPS to allowed clients on `cfg.listen`.
pub async fn serve<H: Handler>(cfg: MetricsTlsConfig, handler: Arc<H>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("bind {}", cfg.listen))?;
    let allowed = Arc::new(cfg.allowed_clients.clone());
    let reloader = Arc::new(Reloader::new(cfg));
    if let Err(e) = reloader.config() {
        // Not fatal: the kubelet's serving certificate arrives after a new node's first pods.
        tracing::warn!(error = %format!("{e:#}"), "metrics TLS: files not loadable yet; handshakes fail until they are");
    }
    let limits = Limits::TCP;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics TLS: accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (handler, allowed, reloader) = (handler.clone(), allowed.clone(), reloader.clone());
        tokio::spawn(async move {
            let config = match reloader.config() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%peer, error = %format!("{e:#}"), "metrics TLS: no usable certificate; connection closed");
                    return;
                }
            };
            let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "metrics TLS: handshake refused");
                    return;
                }
                Err(_) => return,
            };
            let who = authorized(tls.get_ref().1.peer_certificates(), &allowed);
            match who {
                Ok(_) => crate::api::serve_conn(tls, handler, false, limits).await,
                Err(user) => {
                    tracing::debug!(%peer, user, "metrics TLS: client not allowed");
                    crate::api::serve_conn(tls, Arc::new(Forbidden(user)), false, limits).await
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        ca: rcgen::Issuer<'static, rcgen::KeyPair>,
        ca_pem: String,
    }

    fn ca(name: &str) -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Pki {
            ca_pem: pem("CERTIFICATE", cert.der()),
            ca: rcgen::Issuer::new(p, key),
        }
    }

    fn leaf(pki: &Pki, cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, &pki.ca).unwrap();
        (
            pem("CERTIFICATE", cert.der()),
            pem("PRIVATE KEY", &key.serialize_der()),
        )
    }

    fn pem(label: &str, der: &[u8]) -> String {
        let b64 = data_encoding::BASE64.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn only_allowed_common_names_are_authorized() {
        let pki = ca("client-ca");
        let allowed = vec![PROMETHEUS_K8S.to_string()];
        let (prom, _) = leaf(&pki, PROMETHEUS_K8S);
        let (other, _) = leaf(&pki, "system:serviceaccount:default:nosy");
        assert_eq!(
            authorized(Some(&[der(&prom)]), &allowed),
            Ok(PROMETHEUS_K8S.to_string())
        );
        assert_eq!(
            authorized(Some(&[der(&other)]), &allowed),
            Err("system:serviceaccount:default:nosy".to_string())
        );
        assert!(authorized(None, &allowed).is_err());
    }

    fn files(dir: &Path, serving: &Pki, client_ca: &Pki) -> MetricsTlsConfig {
        let (cert, key) = leaf(serving, "node");
        std::fs::write(dir.join("server.pem"), cert + &key).unwrap();
        std::fs::write(dir.join("client-ca.crt"), &client_ca.ca_pem).unwrap();
        MetricsTlsConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            cert_file: dir.join("server.pem"),
            key_file: dir.join("server.pem"),
            client_ca_file: dir.join("client-ca.crt"),
            allowed_clients: vec![PROMETHEUS_K8S.into()],
        }
    }

    #[test]
    fn rotated_files_are_read_again_and_a_broken_rotation_keeps_the_last_good_set() {
        let dir = std::env::temp_dir().join(format!("lb-metrics-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (serving, client) = (ca("serving"), ca("client"));
        let cfg = files(&dir, &serving, &client);
        let r = Reloader::new(cfg.clone());
        let first = r.config().unwrap();
        assert!(
            Arc::ptr_eq(&first, &r.config().unwrap()),
            "unchanged files: same config"
        );
        // A renewed certificate (new file, as the kubelet's symlink switch makes).
        std::fs::remove_file(&cfg.cert_file).unwrap();
        files(&dir, &serving, &client);
        let second = r.config().unwrap();
        assert!(!Arc::ptr_eq(&first, &second), "rotated files: loaded again");
        // A half-written rotation: the last good set stays.
        std::fs::remove_file(&cfg.client_ca_file).unwrap();
        std::fs::write(&cfg.client_ca_file, "-----BEGIN CERTIFICATE-----\ntrunc").unwrap();
        assert!(load(&cfg).is_err());
        assert!(Arc::ptr_eq(&second, &r.config().unwrap()));
        // No good set ever: an error.
        assert!(Reloader::new(cfg).config().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
