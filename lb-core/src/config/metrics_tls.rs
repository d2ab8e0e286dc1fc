//! `[metrics_tls]`: the authenticated /metrics listener's section and its validation (pure;
//! the listener and the reading of its files are lb-userspace's `metrics_tls`).

use std::{net::SocketAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigErrors, Validate};

/// The user name cluster monitoring's Prometheus presents in its client certificate
/// (the `metrics-client-certs` secret of openshift-monitoring).
pub const PROMETHEUS_K8S: &str = "system:serviceaccount:openshift-monitoring:prometheus-k8s";

/// `[metrics_tls]` in lbd's config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsTlsConfig {
    /// Address to listen on (e.g. "0.0.0.0:29445": Prometheus scrapes the pod's IP, which is
    /// the node's for a host-network pod).
    pub listen: SocketAddr,
    /// PEM certificate chain served to clients.
    pub cert_file: PathBuf,
    /// PEM private key (may be the same file as `cert_file`).
    pub key_file: PathBuf,
    /// PEM CA bundle that client certificates must chain to.
    pub client_ca_file: PathBuf,
    /// Subject common names (Kubernetes user names) allowed to read /metrics.
    #[serde(default = "default_allowed")]
    pub allowed_clients: Vec<String>,
}

fn default_allowed() -> Vec<String> {
    vec![PROMETHEUS_K8S.into()]
}

/// Field errors lbd refuses a config for, relative to `[metrics_tls]` (the files are checked
/// when used: they may appear after lbd starts, as the kubelet's serving certificate does on a
/// new node).
impl Validate for MetricsTlsConfig {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        for (name, p) in [
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
            ("client_ca_file", &self.client_ca_file),
        ] {
            if !p.is_absolute() {
                errors.add(name, format!("{} is not an absolute path", p.display()));
            }
        }
        let field = "allowed_clients";
        if self.allowed_clients.iter().any(|c| c.trim().is_empty()) {
            errors.add(field, "an empty name");
        }
        if self.allowed_clients.is_empty() {
            errors.add(field, "empty (nobody could read the metrics)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let cfg = MetricsTlsConfig {
            listen: "0.0.0.0:29445".parse().unwrap(),
            cert_file: "server.pem".into(),
            key_file: "/k".into(),
            client_ca_file: "/c".into(),
            allowed_clients: default_allowed(),
        };
        assert_eq!(
            cfg.validate_at("metrics_tls").unwrap_err().fields(),
            ["metrics_tls.cert_file"]
        );
        let cfg = MetricsTlsConfig {
            cert_file: "/s".into(),
            allowed_clients: vec![],
            ..cfg
        };
        assert_eq!(
            cfg.validate_at("metrics_tls").unwrap_err().fields(),
            ["metrics_tls.allowed_clients"]
        );
    }
}
