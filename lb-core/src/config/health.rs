//! What to check and how often: the `health` table of a VIP service in the config (pure).
//!
//! # Defaults and why
//!
//! The goal (issue 4, product brief) is that a dead backend stops receiving new flows within
//! about one second, where haproxy with OpenShift's settings (`inter 5s fall 3`) needs ~15 s.
//!
//! - `interval_ms = 200`, `timeout_ms = 200`, `fall = 3`, `rise = 2`.
//! - A backend that answers an error (apiserver answering 500 on `/readyz` while it shuts
//!   down): the probe already running may still pass, then `fall` failing probes one interval
//!   apart are needed, so at worst `fall * interval = 600 ms`, about 500 ms on average.
//! - A backend that refuses or resets the connection (its process died) is out at the first
//!   probe that sees it, whatever `fall` says: at worst one interval.
//! - A backend that went silent (node powered off, black-holed packets): each failing probe
//!   lasts the whole timeout, so at worst `fall * interval + timeout = 800 ms`.
//! - Both leave room inside the 1 s budget for the Maglev table swap (tens of ms).
//! - `fall = 3` rather than 2: a single lost SYN makes a probe time out (the kernel retransmits
//!   SYN only after 1 s), so `fall = 2` would turn two unlucky packets into a false "down".
//!   A false "down" is cheap anyway: established flows stay put and `rise = 2` brings the
//!   backend back 200-400 ms later.
//! - `timeout_ms = 200` is ~100x a LAN TLS handshake plus `/readyz`. It must not exceed the
//!   interval: probes of one backend never overlap, so the bounds above hold.
//! - The load is small: 5 probes/s per backend per node; haproxy's is 0.2/s, and every node
//!   must check every backend so they all build the same table.
//! - `expect_status = "200-399"`, as haproxy's `httpchk`: 2xx and 3xx mean up.
//! - `kind = "https"`, `path = "/readyz"`, port = the service port: the kube-apiserver case.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigErrors, Validate};

/// Which probe to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// TLS without certificate verification, then `GET path` (haproxy `check-ssl verify none`).
    #[default]
    Https,
    /// Plain `GET path` (the router's `/healthz` on 1936).
    Http,
    /// A TCP connect that completes.
    Tcp,
    /// No check: the backend is always up.
    None,
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckKind::Https => "https",
            CheckKind::Http => "http",
            CheckKind::Tcp => "tcp",
            CheckKind::None => "none",
        })
    }
}

/// An inclusive range of HTTP status codes that count as healthy, written `"200-399"` or
/// `"200"` in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct StatusRange {
    pub lo: u16,
    pub hi: u16,
}

impl StatusRange {
    pub const fn new(lo: u16, hi: u16) -> Self {
        Self { lo, hi }
    }

    pub fn contains(&self, status: u16) -> bool {
        (self.lo..=self.hi).contains(&status)
    }
}

impl Default for StatusRange {
    fn default() -> Self {
        Self::new(200, 399)
    }
}

impl fmt::Display for StatusRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl From<StatusRange> for String {
    fn from(r: StatusRange) -> String {
        r.to_string()
    }
}

impl TryFrom<String> for StatusRange {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl std::str::FromStr for StatusRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let code = |t: &str| -> Result<u16, String> {
            match t.trim().parse::<u16>() {
                Ok(c) if (100..=599).contains(&c) => Ok(c),
                _ => Err(format!(
                    "{t:?} is not an HTTP status code (100-599); write \"200\" or \"200-399\""
                )),
            }
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (code(a)?, code(b)?),
            None => {
                let c = code(s)?;
                (c, c)
            }
        };
        if lo > hi {
            return Err(format!("{s:?}: the range is empty ({lo} > {hi})"));
        }
        Ok(Self { lo, hi })
    }
}

/// Health check settings of one service. Every field has a default (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub kind: CheckKind,
    /// Port to probe; `None` means the service's own port (the target's address).
    pub port: Option<u16>,
    /// Request path for `http` and `https`.
    pub path: String,
    /// Time between the starts of two probes of one backend.
    pub interval_ms: u64,
    /// Hard limit on one probe: connect + TLS + request + status line. `<= interval_ms`.
    pub timeout_ms: u64,
    /// Consecutive successes that bring a down backend up.
    pub rise: u32,
    /// Consecutive failures that take an up backend down.
    pub fall: u32,
    /// Status codes that mean healthy (`http`, `https`).
    pub expect_status: StatusRange,
    /// Slow start: a backend that returns (or first passes its checks after lbd has seen it
    /// fail; not one that passes its first check, which was serving already) takes new flows
    /// gradually over this period, in [`SLOW_START_STEPS`] steps of its Maglev weight; 0: at
    /// once. Established flows stay where they are (connection table).
    pub slow_start_ms: u64,
    /// Fail-open: when every backend of the service fails its checks at once by being slow or
    /// answering wrong (not by refusing or resetting connections), new flows keep going to
    /// them rather than nowhere (see `plan`).
    pub fail_open: bool,
    /// A refused connection means "nothing here to serve", not "down": the backend is not
    /// expected up (`lbd_backend_expected 0`), e.g. a node of the ingress VIP without a router.
    pub absent_when_refused: bool,
}

/// Slow start climbs in this many equal steps of the weight (the first step at once).
pub const SLOW_START_STEPS: u32 = 20;
const MAX_SLOW_START_MS: u64 = 3_600_000;

pub const DEFAULT_INTERVAL_MS: u64 = 200;
pub const DEFAULT_TIMEOUT_MS: u64 = 200;
pub const DEFAULT_RISE: u32 = 2;
pub const DEFAULT_FALL: u32 = 3;
pub const DEFAULT_PATH: &str = "/readyz";

/// Bounds that catch typos (an interval in seconds, a timeout of hours) rather than policy.
const MIN_INTERVAL_MS: u64 = 10;
const MAX_INTERVAL_MS: u64 = 3_600_000;
const MAX_RISE_FALL: u32 = 1000;

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            kind: CheckKind::Https,
            port: None,
            path: DEFAULT_PATH.to_string(),
            interval_ms: DEFAULT_INTERVAL_MS,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            rise: DEFAULT_RISE,
            fall: DEFAULT_FALL,
            expect_status: StatusRange::default(),
            slow_start_ms: 0,
            fail_open: true,
            absent_when_refused: false,
        }
    }
}

impl HealthConfig {
    /// HTTPS `GET path` with the other settings at their defaults.
    pub fn https(path: &str) -> Self {
        Self {
            path: path.to_string(),
            ..Self::default()
        }
    }

    /// Plain HTTP `GET path` with the other settings at their defaults.
    pub fn http(path: &str) -> Self {
        Self {
            kind: CheckKind::Http,
            path: path.to_string(),
            ..Self::default()
        }
    }

    /// TCP connect with the other settings at their defaults.
    pub fn tcp() -> Self {
        Self {
            kind: CheckKind::Tcp,
            ..Self::default()
        }
    }
}

/// Fields relative to this health table (`interval_ms`); the config names them
/// `vips[0].health.interval_ms`.
impl Validate for HealthConfig {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&self.interval_ms) {
            errors.add(
                "interval_ms",
                format!(
                    "must be between {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS}, got {}",
                    self.interval_ms
                ),
            );
        }
        if self.timeout_ms == 0 || self.timeout_ms > self.interval_ms {
            errors.add(
                "timeout_ms",
                format!(
                    "must be > 0 and <= interval_ms ({}), got {}; probes of one backend must not overlap",
                    self.interval_ms, self.timeout_ms
                ),
            );
        }
        for (name, v) in [("rise", self.rise), ("fall", self.fall)] {
            if !(1..=MAX_RISE_FALL).contains(&v) {
                errors.add(
                    name,
                    format!("must be between 1 and {MAX_RISE_FALL}, got {v}"),
                );
            }
        }
        if self.slow_start_ms > MAX_SLOW_START_MS {
            errors.add(
                "slow_start_ms",
                format!(
                    "must be at most {MAX_SLOW_START_MS} (an hour), got {}",
                    self.slow_start_ms
                ),
            );
        }
        if self.port == Some(0) {
            errors.add("port", "must be 1-65535, got 0");
        }
        if matches!(self.kind, CheckKind::Http | CheckKind::Https) {
            // The path goes verbatim into the request line: it must be one token.
            let bad = self
                .path
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || !b.is_ascii());
            if !self.path.starts_with('/') || bad {
                errors.add(
                    "path",
                    format!(
                        "must start with '/' and hold no spaces, control or non-ASCII characters, got {:?}",
                        self.path
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<HealthConfig, String> {
        toml::from_str::<HealthConfig>(s).map_err(|e| e.to_string())
    }

    #[test]
    fn empty_table_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, HealthConfig::default());
        assert_eq!(c.kind, CheckKind::Https);
        assert_eq!(c.path, "/readyz");
        assert_eq!(c.expect_status, StatusRange::new(200, 399));
        c.validate().unwrap();
    }

    #[test]
    fn defaults_detect_a_dead_backend_within_a_second() {
        let c = HealthConfig::default();
        // Worst case for a silent backend: the probe that was running passes, then `fall`
        // probes each end at their timeout.
        let worst = c.fall as u64 * c.interval_ms + c.timeout_ms;
        assert!(worst <= 1000, "{worst} ms");
    }

    #[test]
    fn full_table_round_trips() {
        let c = parse(
            r#"
            kind = "http"
            port = 1936
            path = "/healthz"
            interval_ms = 500
            timeout_ms = 300
            rise = 1
            fall = 2
            expect_status = "200"
            slow_start_ms = 60000
            fail_open = false
            absent_when_refused = true
            "#,
        )
        .unwrap();
        assert_eq!(c.kind, CheckKind::Http);
        assert_eq!(c.port, Some(1936));
        assert_eq!(c.expect_status, StatusRange::new(200, 200));
        assert_eq!(c.slow_start_ms, 60_000);
        assert!(!c.fail_open && c.absent_when_refused);
        let back = parse(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        assert!(
            parse("intervall_ms = 5")
                .unwrap_err()
                .contains("intervall_ms")
        );
        assert!(parse("kind = \"udp\"").is_err());
        assert!(parse("expect_status = \"399-200\"").is_err());
        assert!(parse("expect_status = \"abc\"").is_err());
        assert!(parse("expect_status = \"2000\"").is_err());
    }

    #[test]
    fn validate_names_the_field() {
        let base = HealthConfig::default();
        let cases = [
            (
                HealthConfig {
                    timeout_ms: 0,
                    ..base.clone()
                },
                "vips[1].health.timeout_ms: must be > 0 and <= interval_ms",
            ),
            (
                HealthConfig {
                    timeout_ms: 300,
                    ..base.clone()
                },
                "vips[1].health.timeout_ms:",
            ),
            (
                HealthConfig {
                    interval_ms: 1,
                    timeout_ms: 1,
                    ..base.clone()
                },
                "vips[1].health.interval_ms:",
            ),
            (
                HealthConfig {
                    rise: 0,
                    ..base.clone()
                },
                "vips[1].health.rise:",
            ),
            (
                HealthConfig {
                    fall: 0,
                    ..base.clone()
                },
                "vips[1].health.fall:",
            ),
            (
                HealthConfig {
                    port: Some(0),
                    ..base.clone()
                },
                "vips[1].health.port:",
            ),
            (
                HealthConfig {
                    slow_start_ms: 3_600_001,
                    ..base.clone()
                },
                "vips[1].health.slow_start_ms:",
            ),
            (
                HealthConfig {
                    path: "readyz".into(),
                    ..base.clone()
                },
                "vips[1].health.path:",
            ),
            (
                HealthConfig {
                    path: "/a b".into(),
                    ..base.clone()
                },
                "vips[1].health.path:",
            ),
        ];
        for (c, want) in cases {
            let err = c.validate_at("vips[1].health").unwrap_err().to_string();
            assert!(err.starts_with(want), "{err:?} should start with {want:?}");
        }
        // A TCP check has no path to validate.
        HealthConfig {
            path: String::new(),
            ..HealthConfig::tcp()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn status_range() {
        let r: StatusRange = "200-299".parse().unwrap();
        assert!(r.contains(200) && r.contains(299) && !r.contains(300) && !r.contains(199));
        assert_eq!(r.to_string(), "200-299");
        assert_eq!("204".parse::<StatusRange>().unwrap().to_string(), "204");
    }
}
