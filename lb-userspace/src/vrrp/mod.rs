//! VRRP: see submodules.
