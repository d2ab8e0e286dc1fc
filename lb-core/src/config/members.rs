//! The `[members]` section (pure validation; the keys are read by
//! lb-userspace's `sync::config::KeyRing`, the one place cluster keys are read).

use std::{net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{ConfigErrors, Validate};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembersConfig {
    /// The cluster key (the same file as `[sync]`'s on rendered nodes): announcements are
    /// signed with it and accepted with it.
    pub key_file: PathBuf,
    /// Other keys accepted (a rotation's overlap, as `sync.accept_key_files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_key_files: Vec<PathBuf>,
    /// UDP port, the same on every node.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Address to bind; default: any.
    #[serde(default)]
    pub listen: Option<IpAddr>,
    /// How often this node announces itself to every node it knows.
    #[serde(default = "default_announce_ms")]
    pub announce_ms: u64,
    /// A learned node silent this long is no longer a peer.
    #[serde(default = "default_expire_ms")]
    pub expire_ms: u64,
    /// At start, how long the VRRP instances wait at most for every floor peer to answer.
    #[serde(default = "default_join_wait_ms")]
    pub join_wait_ms: u64,
}

pub const DEFAULT_PORT: u16 = 1941;
pub const DEFAULT_ANNOUNCE_MS: u64 = 1000;
pub const DEFAULT_EXPIRE_MS: u64 = 30_000;
pub const DEFAULT_JOIN_WAIT_MS: u64 = 3000;

fn default_port() -> u16 {
    DEFAULT_PORT
}
fn default_announce_ms() -> u64 {
    DEFAULT_ANNOUNCE_MS
}
fn default_expire_ms() -> u64 {
    DEFAULT_EXPIRE_MS
}
fn default_join_wait_ms() -> u64 {
    DEFAULT_JOIN_WAIT_MS
}

/// Fields relative to `[members]`.
impl Validate for MembersConfig {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        if self.key_file.as_os_str().is_empty() {
            errors.add("key_file", "must be a path");
        }
        if self.port == 0 {
            errors.add("port", "must be 1-65535");
        }
        if !(100..=60_000).contains(&self.announce_ms) {
            errors.add(
                "announce_ms",
                format!("must be 100-60000, got {}", self.announce_ms),
            );
        }
        if self.expire_ms < 3 * self.announce_ms {
            errors.add(
                "expire_ms",
                format!(
                    "must be at least 3 x announce_ms ({}), got {}",
                    3 * self.announce_ms,
                    self.expire_ms
                ),
            );
        }
        if self.join_wait_ms > 60_000 {
            errors.add(
                "join_wait_ms",
                format!("must be at most 60000, got {}", self.join_wait_ms),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let base: MembersConfig = toml::from_str("key_file = \"/etc/lb/sync.key\"").unwrap();
        assert!(base.validate().is_ok());
        assert_eq!(base.port, DEFAULT_PORT);
        let field = |c: &MembersConfig| {
            let mut e = ConfigErrors::new();
            e.within("members", c);
            e.fields().first().expect("an error").to_string()
        };
        let mut c = base.clone();
        c.expire_ms = 1000;
        assert_eq!(field(&c), "members.expire_ms");
        let mut c = base.clone();
        c.announce_ms = 10;
        assert_eq!(field(&c), "members.announce_ms");
        let mut c = base.clone();
        c.port = 0;
        assert_eq!(field(&c), "members.port");
    }
}
