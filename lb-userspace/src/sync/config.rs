//! The cluster keys of a `[sync]` section, read when lbd starts and on every reload: [`KeyRing`]
//! is the one place keys are read. The section itself and the checks of a key (pure) are
//! `lb_core::config::sync`, re-exported here.

use std::path::PathBuf;

pub use lb_core::config::sync::*;

use crate::config::ConfigError;

/// The keys of a `[sync]` section, read and checked: the one signed with and every one
/// accepted (that one first).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyRing {
    pub sign: Vec<u8>,
    /// Accepted besides `sign` (duplicates of it left out).
    pub also_accept: Vec<Vec<u8>>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key bytes.
        write!(f, "KeyRing({} accepted)", 1 + self.also_accept.len())
    }
}

impl KeyRing {
    /// Read `cfg`'s key files; an error names the field (`sync.key_file`,
    /// `sync.accept_key_files[i]`).
    pub fn load(cfg: &SyncConfig) -> Result<KeyRing, ConfigError> {
        KeyRing::read("sync", &cfg.key_file, &cfg.accept_key_files)
    }

    /// Read a section's `key_file` and `accept_key_files` (the membership announcements use
    /// the same cluster key as the sync: `section` names the fields of errors).
    pub fn read(
        section: &str,
        key_file: &std::path::Path,
        accept_key_files: &[PathBuf],
    ) -> Result<KeyRing, ConfigError> {
        let rename = |field: String| {
            move |e: ConfigError| ConfigError::new(format!("{section}.{field}"), e.reason)
        };
        let sign = read_key(key_file).map_err(rename("key_file".into()))?;
        let mut also_accept: Vec<Vec<u8>> = Vec::new();
        for (i, f) in accept_key_files.iter().enumerate() {
            let k = read_key(f).map_err(rename(format!("accept_key_files[{i}]")))?;
            if k != sign && !also_accept.contains(&k) {
                also_accept.push(k);
            }
        }
        Ok(KeyRing { sign, also_accept })
    }

    /// Every key accepted, the signing one first.
    pub fn accepted(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.sign.as_slice()).chain(self.also_accept.iter().map(|k| k.as_slice()))
    }
}

/// Read and check the cluster key ([`check_key_mode`], [`check_key`]): not readable by group
/// or others, and at least [`MIN_KEY_LEN`] bytes.
pub fn read_key(path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let unreadable =
        |e: std::io::Error| ConfigError::new("sync.key_file", format!("{}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    check_key_mode(path, meta.permissions().mode())?;
    check_key(path, std::fs::read(path).map_err(unreadable)?)
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

    #[test]
    fn a_key_ring_signs_with_key_file_and_accepts_the_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lb-sync-ring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, b: u8, mode: u32| {
            let p = dir.join(name);
            std::fs::write(&p, [b; 32]).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let new = write("new", b'n', 0o600);
        let old = write("old", b'o', 0o600);
        let open = write("open", b'x', 0o644);
        let mut c = base();
        c.key_file = new.clone();
        c.accept_key_files = vec![old.clone(), new.clone()];
        let ring = KeyRing::load(&c).unwrap();
        assert_eq!(ring.sign, vec![b'n'; 32]);
        assert_eq!(
            ring.also_accept,
            vec![vec![b'o'; 32]],
            "the signing key is not listed twice"
        );
        assert_eq!(ring.accepted().count(), 2);
        assert!(
            !format!("{ring:?}").contains("nnnn"),
            "Debug never shows a key"
        );
        c.accept_key_files = vec![old, open];
        match KeyRing::load(&c) {
            Err(ConfigError { field, .. }) => {
                assert_eq!(field, "sync.accept_key_files[1]")
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn read_key_reads_the_file_and_checks_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lb-sync-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, b"short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(read_key(&p), Err(ConfigError { field, .. }) if field == "sync.key_file"));
        std::fs::write(&p, [b'k'; 40]).unwrap();
        assert_eq!(read_key(&p).unwrap().len(), 40);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_key(&p).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
