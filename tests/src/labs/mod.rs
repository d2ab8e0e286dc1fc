//! Network-namespace labs and what they run: the lab itself (`lab`), the shapes built on it
//! (DSR, VRRP, BGP, an OpenShift-like cluster, static pods) and the tools their nodes use.

pub mod bgp_lab;
pub mod brex;
pub mod cgroup;
pub mod cluster;
pub mod dsr;
pub mod keepalived_haproxy;
pub mod lab;
pub mod openshift;
pub mod pods;
pub mod vrrp_lab;
pub mod vrrp_send;
