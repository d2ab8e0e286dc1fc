//! The `[sync]` section: its validation and the checks of a cluster key's file (pure; the files
//! are read by lb-userspace's `sync::config::KeyRing`, when lbd starts and on every reload).
//! Every field applies on reload (`daemon/sync.rs`).
//!
//! Key rotation needs an overlap, so that no node ever refuses a datagram of a node that has
//! not changed its key yet (a rolling restart's last flush above all): `key_file` is the key
//! this node signs with, and `accept_key_files` are keys it accepts besides. Rotating is three
//! roll-outs, each in any order across nodes: add the new key to `accept_key_files`; make it
//! `key_file` and the old one accepted; drop the old one (docs/config.md, *Rotating the key*).
//! lb-userspace's `KeyRing` is the one place keys are read.

use std::{net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, ConfigErrors, Validate};

/// Shortest cluster key accepted: 32 bytes (HMAC-SHA256's output size).
pub const MIN_KEY_LEN: usize = 32;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncConfig {
    /// The other lbd nodes that may forward this node's VIPs next (their addresses, as the
    /// datagrams' source). Only these are sent to and only these are listened to.
    pub peers: Vec<IpAddr>,
    /// A file holding the cluster key (at least 32 bytes, the same on every node, readable by
    /// root only): datagrams are signed with it, and accepted with it.
    pub key_file: PathBuf,
    /// Other keys accepted (not signed with): the overlap of a key rotation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_key_files: Vec<PathBuf>,
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

/// A problem with a key file (`field` relative to `[sync]`, as lb-userspace's `KeyRing::read`
/// renames it).
fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("sync.{field}"), reason)
}

/// Fields relative to `[sync]`; [`SyncConfig::fits`] checks what needs the rest of the config.
impl Validate for SyncConfig {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        if self.peers.is_empty() {
            errors.add("peers", "must name at least one peer");
        }
        // No cap on the number of peers: a scan's datagrams go to each peer in turn, so the
        // cost grows with peers x exceptions (bounded by `max_entries`), not with a limit here.
        for (i, p) in self.peers.iter().enumerate() {
            if p.is_unspecified() || p.is_multicast() || p.is_loopback() {
                errors.add(
                    format!("peers[{i}]"),
                    format!("{p} is not a node's unicast address"),
                );
            }
            if self.peers[..i].contains(p) {
                errors.add(format!("peers[{i}]"), format!("{p} is listed twice"));
            }
        }
        if self.port == 0 {
            errors.add("port", "must be 1-65535");
        }
        if !(100..=60_000).contains(&self.interval_ms) {
            errors.add(
                "interval_ms",
                format!("must be 100-60000, got {}", self.interval_ms),
            );
        }
        if !(1..=1_048_576).contains(&self.max_entries) {
            errors.add(
                "max_entries",
                format!("must be 1-1048576, got {}", self.max_entries),
            );
        }
        if self.key_file.as_os_str().is_empty() {
            errors.add("key_file", "must be a path");
        }
        for (i, f) in self.accept_key_files.iter().enumerate() {
            if f.as_os_str().is_empty() {
                errors.add(format!("accept_key_files[{i}]"), "must be a path");
            }
        }
    }
}

impl SyncConfig {
    /// The most connection-table entries the peers' exceptions may install on this node:
    /// each peer sends up to `max_entries`.
    pub fn peer_entries(&self) -> u64 {
        self.peers.len() as u64 * u64::from(self.max_entries)
    }

    /// The default `max_entries` lowered to the share of half of `conntrack_size` each peer
    /// may fill, so that a config that does not set it (as every config written before the
    /// check below existed) keeps loading with many peers; another value is checked by
    /// [`SyncConfig::fits`] and refused when it does not fit.
    pub fn settle(&mut self, conntrack_size: u32) {
        if self.max_entries == DEFAULT_MAX_ENTRIES {
            let peers = (self.peers.len() as u64).max(1);
            let share = (u64::from(conntrack_size) / 2 / peers).max(1);
            self.max_entries = self.max_entries.min(share as u32);
        }
    }

    /// The peers' exceptions must fit in half of the connection table (`conntrack_size`): the
    /// table is an LRU, and entries installed for peers beyond that would push out the node's
    /// own connections' entries. (Peers a `[members]` announcement adds later are not counted
    /// here; each still sends at most `max_entries`.)
    pub fn fits(&self, conntrack_size: u32, errors: &mut ConfigErrors) {
        let room = u64::from(conntrack_size) / 2;
        if self.peer_entries() > room {
            let most = room / (self.peers.len() as u64).max(1);
            errors.add(
                "sync.max_entries",
                format!(
                    "{} sync.peers x sync.max_entries {} = {} entries the peers may install, \
                     more than half of conntrack_size {conntrack_size}: set sync.max_entries \
                     to at most {most} or raise conntrack_size",
                    self.peers.len(),
                    self.max_entries,
                    self.peer_entries()
                ),
            );
        }
    }
}

/// A key file's mode, as read: not readable by group or others. Pure (the file is read by
/// lb-userspace's `sync::config::read_key`).
pub fn check_key_mode(path: &std::path::Path, mode: u32) -> Result<(), ConfigError> {
    if mode & 0o077 != 0 {
        return Err(invalid(
            "key_file",
            format!(
                "{} is readable by group or others (mode {:o}): chmod 600",
                path.display(),
                mode & 0o777
            ),
        ));
    }
    Ok(())
}

/// A key file's bytes, as read: trailing whitespace from an editor or `echo` dropped, then at
/// least [`MIN_KEY_LEN`] bytes. Pure.
pub fn check_key(path: &std::path::Path, mut key: Vec<u8>) -> Result<Vec<u8>, ConfigError> {
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
            accept_key_files: Vec::new(),
            port: 1940,
            listen: None,
            interval_ms: 2000,
            max_entries: 65536,
        }
    }

    /// The first field named, as the daemon's config names it.
    fn field(c: &SyncConfig) -> String {
        let mut e = ConfigErrors::new();
        e.within("sync", c);
        e.fields().first().expect("an error").to_string()
    }

    fn fits(c: &SyncConfig, conntrack_size: u32) -> Result<(), ConfigErrors> {
        let mut e = ConfigErrors::new();
        c.fits(conntrack_size, &mut e);
        e.into_result()
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
        let mut c = base();
        c.accept_key_files = vec!["".into()];
        assert_eq!(field(&c), "sync.accept_key_files[0]");
    }

    #[test]
    fn peers_times_max_entries_must_fit_half_the_connection_table() {
        let mut c = base();
        c.peers = (1..=4)
            .map(|i| format!("10.0.0.{i}").parse().unwrap())
            .collect();
        c.max_entries = 32768;
        // 4 x 32768 = 131072: half of the default 262144.
        assert!(fits(&c, 262_144).is_ok());
        c.max_entries = 32769;
        let e = fits(&c, 262_144).unwrap_err().to_string();
        assert!(e.starts_with("sync.max_entries: "), "{e}");
        for part in ["sync.peers", "conntrack_size 262144", "at most 32768"] {
            assert!(e.contains(part), "{e}");
        }
        // The whole config says so too.
        let cfg: crate::config::Config = toml::from_str(
            r#"
interface = "eth0"
conntrack_size = 1024
[sync]
peers = ["10.0.0.2", "10.0.0.3"]
key_file = "/etc/lb/sync.key"
max_entries = 300
"#,
        )
        .unwrap();
        let e = cfg.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("sync.max_entries: ") && e.contains("conntrack_size 1024"),
            "{e}"
        );
    }

    /// A config that leaves `max_entries` at its default loads with any number of peers: the
    /// default is lowered to fit; an explicit value that does not fit is still refused.
    #[test]
    fn the_default_max_entries_is_lowered_to_fit_and_an_explicit_one_is_not() {
        let text = |extra: &str| {
            format!(
                "interface = \"eth0\"\n[sync]\npeers = [\"10.0.0.2\", \"10.0.0.3\", \"10.0.0.4\", \"10.0.0.5\"]\nkey_file = \"/etc/lb/sync.key\"\n{extra}"
            )
        };
        let cfg = crate::config::Config::parse(&text("")).unwrap();
        let s = cfg.sync.as_ref().unwrap();
        // 4 peers, half of the default 262,144 entries: 32,768 each.
        assert_eq!(s.max_entries, (cfg.conntrack_size / 2) / 4);
        assert!(fits(s, cfg.conntrack_size).is_ok());
        let e = crate::config::Config::parse(&text("max_entries = 40000\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("sync.max_entries: "), "{e}");
        // Few peers: the default stays.
        let two = "interface = \"eth0\"\n[sync]\npeers = [\"10.0.0.2\"]\nkey_file = \"/k\"\n";
        let cfg = crate::config::Config::parse(two).unwrap();
        assert_eq!(cfg.sync.unwrap().max_entries, DEFAULT_MAX_ENTRIES);
    }

    #[test]
    fn more_than_sixteen_peers_are_accepted() {
        // An ingress pool of 250 routers: every other one is a sync peer of each.
        let mut c = base();
        c.peers = (1..250u8).map(|i| IpAddr::from([10, 0, 1, i])).collect();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn keys_too_short_or_open_to_others_are_refused() {
        let p = std::path::Path::new("/etc/lb/sync.key");
        let e = check_key(p, b"short\n".to_vec()).unwrap_err();
        assert_eq!(e.field, "sync.key_file");
        assert!(e.reason.contains("5 bytes"), "{}", e.reason);
        let mut k = vec![b'k'; 40];
        k.extend_from_slice(b" \n");
        assert_eq!(check_key(p, k).unwrap(), vec![b'k'; 40]);
        assert!(check_key_mode(p, 0o100600).is_ok());
        let e = check_key_mode(p, 0o100644).unwrap_err();
        assert_eq!(e.field, "sync.key_file");
        assert!(e.reason.contains("mode 644"), "{}", e.reason);
    }
}
