//! The health checks a rendered node runs, and their timing beside OpenShift's (the table in
//! docs/rendering.md says the same, with the reasons). Pure.
//!
//! - API backends (haproxy's `masters` backend on OpenShift: `GET /readyz` over TLS, `inter 5s
//!   fall 3 rise 1`, `timeout check 10s`; since OCPBUGS-100065 `fall 2 fastinter 2s rise 3
//!   slowstart 60s`): HTTPS `/readyz` on 6443 every 200 ms with a 200 ms timeout, so a silent
//!   apiserver is out within `3 x 200 + 200 = 800 ms` and one that refuses or resets at its next
//!   check; a returning one must pass for 4 s in a row (`rise = 20`: the time haproxy's `rise 3`
//!   at `fastinter 2s` needs) and then climbs to its full share of new flows over 60 s (haproxy's
//!   `slowstart 60s`); when every apiserver is merely slow (an etcd latency spike), the VIP fails
//!   open instead of dropping every new connection, which haproxy gets from its 10 s check
//!   timeout.
//! - Ingress backends: the router's readiness, `GET /healthz/ready` on its stats port (1936 for
//!   the default IngressController), not its liveness `/healthz`: a router that is starting
//!   (routes not loaded) or draining answers 503 there. A node where nothing listens on the stats
//!   port runs no router of that controller: `absent_when_refused` makes it `absent` (not
//!   expected up) instead of `down`. No slow start: a router serves at full speed once its routes
//!   are loaded, which is what ready means.
//! - Tracked checks (VRRP priority): OpenShift's scripts' rise and fall counts, at lb's 200 ms
//!   interval (keepalived: 1-5 s) so the election still follows a failure within a second.

use crate::config::health::{CheckKind, HealthConfig};

/// The kube-apiserver's readiness as the API VIP's backends are checked.
pub const API_RISE: u32 = 20;
/// haproxy's `slowstart 60s` on OpenShift's API backends.
pub const API_SLOW_START_MS: u64 = 60_000;
/// The router's readiness endpoint (openshift/router: routes loaded, not shutting down).
pub const ROUTER_READY_PATH: &str = "/healthz/ready";
/// The router's liveness endpoint.
pub const ROUTER_LIVE_PATH: &str = "/healthz";

/// The API VIP's backend check: the apiserver's `/readyz` on 6443.
pub fn api_health() -> HealthConfig {
    HealthConfig {
        kind: CheckKind::Https,
        path: "/readyz".into(),
        port: Some(6443),
        rise: API_RISE,
        slow_start_ms: API_SLOW_START_MS,
        ..HealthConfig::default()
    }
}

/// An ingress VIP's backend check: the router's readiness on its stats port; a node where
/// nothing listens there has no router of this controller (`absent`).
pub fn router_health(stats_port: u16) -> HealthConfig {
    HealthConfig {
        kind: CheckKind::Http,
        path: ROUTER_READY_PATH.into(),
        port: Some(stats_port),
        rise: 3,
        absent_when_refused: true,
        ..HealthConfig::default()
    }
}

/// `(rise, fall)` of OpenShift's tracked script `script` (machine-config-operator's
/// keepalived.conf.tmpl: `chk_ocp_*` and `chk_mcs` rise 3 fall 3 every 2 s, the ingress
/// scripts rise 3 fall 2 every 1 s, `chk_default_ingress` every 5 s).
pub fn track_counts(script: &str) -> (u32, u32) {
    if script.starts_with("chk_ocp") || script.starts_with("chk_mcs") {
        (3, 3)
    } else {
        (3, 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Validate;

    #[test]
    fn the_api_check_still_finds_a_dead_apiserver_within_a_second() {
        let c = api_health();
        c.validate().unwrap();
        let silent = c.fall as u64 * c.interval_ms + c.timeout_ms;
        assert!(silent < 1000, "{silent} ms");
        // Refused or reset: out at the first check that sees it.
        assert!(c.interval_ms + c.timeout_ms < 1000);
        assert_eq!(
            c.rise as u64 * c.interval_ms,
            4000,
            "haproxy's rise 3 at fastinter 2s"
        );
        assert!(c.fail_open && !c.absent_when_refused);
    }

    #[test]
    fn the_router_check_is_its_readiness_and_absence_is_not_down() {
        let c = router_health(1937);
        c.validate().unwrap();
        assert_eq!((c.path.as_str(), c.port), ("/healthz/ready", Some(1937)));
        assert!(c.absent_when_refused && c.slow_start_ms == 0);
    }
}
