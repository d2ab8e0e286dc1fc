//! The `[sync]` section (pure validation; the key file is read when lbd starts).

use std::{net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// Shortest cluster key accepted: 32 bytes (HMAC-SHA256's output size).
pub const MIN_KEY_LEN: usize = 32;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncConfig {
    /// The other lbd nodes that may forward this node's VIPs next (their addresses, as the
    /// datagrams' source). Only these are sent to and only these are listened to.
    pub peers: Vec<IpAddr>,
    /// A file holding the cluster key (at least 32 bytes, the same on every node, readable by
    /// root only).
    pub key_file: PathBuf,
    /// UDP port, the same on every node.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Address to bind (and send from); default: any (the kernel's route source).
    #[serde(default)]
    pub listen: Option<IpAddr>,
    /// How often the connection table is scanned (besides after each table change).
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Most exception entries kept and sent per scan: bounds memory and bandwidth.
    #[serde(default = "default_max_entries")]
    pub max_entries: u32,
}

pub const DEFAULT_PORT: u16 = 1940;
pub const DEFAULT_INTERVAL_MS: u64 = 2000;
pub const DEFAULT_MAX_ENTRIES: u32 = 65536;

fn default_port() -> u16 {
    DEFAULT_PORT
}
fn default_interval_ms() -> u64 {
    DEFAULT_INTERVAL_MS
}
fn default_max_entries() -> u32 {
    DEFAULT_MAX_ENTRIES
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: format!("sync.{field}"),
        reason: reason.into(),
    }
}

impl SyncConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.peers.is_empty() {
            return Err(invalid("peers", "must name at least one peer"));
        }
        if self.peers.len() > 16 {
            return Err(invalid("peers", "at most 16 peers"));
        }
        for (i, p) in self.peers.iter().enumerate() {
            if p.is_unspecified() || p.is_multicast() || p.is_loopback() {
                return Err(invalid(
                    &format!("peers[{i}]"),
                    format!("{p} is not a node's unicast address"),
                ));
            }
            if self.peers[..i].contains(p) {
                return Err(invalid(
                    &format!("peers[{i}]"),
                    format!("{p} is listed twice"),
                ));
            }
        }
        if self.port == 0 {
            return Err(invalid("port", "must be 1-65535"));
        }
        if !(100..=60_000).contains(&self.interval_ms) {
            return Err(invalid(
                "interval_ms",
                format!("must be 100-60000, got {}", self.interval_ms),
            ));
        }
        if !(1..=1_048_576).contains(&self.max_entries) {
            return Err(invalid(
                "max_entries",
                format!("must be 1-1048576, got {}", self.max_entries),
            ));
        }
        if self.key_file.as_os_str().is_empty() {
            return Err(invalid("key_file", "must be a path"));
        }
        Ok(())
    }
}

/// Read and check the cluster key: at least [`MIN_KEY_LEN`] bytes (trailing whitespace from an
/// editor or `echo` dropped), and not readable by group or others.
pub fn read_key(path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| invalid("key_file", format!("{}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(invalid(
            "key_file",
            format!(
                "{} is readable by group or others (mode {:o}): chmod 600",
                path.display(),
                meta.permissions().mode() & 0o777
            ),
        ));
    }
    let mut key =
        std::fs::read(path).map_err(|e| invalid("key_file", format!("{}: {e}", path.display())))?;
    while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
        key.pop();
    }
    if key.len() < MIN_KEY_LEN {
        return Err(invalid(
            "key_file",
            format!(
                "{} holds {} bytes, at least {MIN_KEY_LEN} needed",
                path.display(),
                key.len()
            ),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SyncConfig {
        SyncConfig {
            peers: vec!["10.0.0.2".parse().unwrap()],
            key_file: "/etc/lb/sync.key".into(),
            port: 1940,
            listen: None,
            interval_ms: 2000,
            max_entries: 65536,
        }
    }

    fn field(c: &SyncConfig) -> String {
        match c.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_fields_are_named() {
        assert!(base().validate().is_ok());
        let mut c = base();
        c.peers.clear();
        assert_eq!(field(&c), "sync.peers");
        let mut c = base();
        c.peers.push("10.0.0.2".parse().unwrap());
        assert_eq!(field(&c), "sync.peers[1]");
        let mut c = base();
        c.peers = vec!["0.0.0.0".parse().unwrap()];
        assert_eq!(field(&c), "sync.peers[0]");
        let mut c = base();
        c.interval_ms = 10;
        assert_eq!(field(&c), "sync.interval_ms");
        let mut c = base();
        c.max_entries = 0;
        assert_eq!(field(&c), "sync.max_entries");
        let mut c = base();
        c.port = 0;
        assert_eq!(field(&c), "sync.port");
    }

    #[test]
    fn keys_too_short_or_open_to_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lb-sync-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, b"short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            matches!(read_key(&p), Err(ConfigError::Invalid { field, .. }) if field == "sync.key_file")
        );
        std::fs::write(&p, [b'k'; 40]).unwrap();
        assert_eq!(read_key(&p).unwrap().len(), 40);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_key(&p).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
