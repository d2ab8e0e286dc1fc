//! `aya::Pod` for the map types, so user space can put them in maps (feature `user`).
use super::*;
unsafe impl aya::Pod for VipKey {}
unsafe impl aya::Pod for VipInfo {}
unsafe impl aya::Pod for BackendInfo {}
unsafe impl aya::Pod for FlowKey {}
unsafe impl aya::Pod for FlowValue {}
unsafe impl aya::Pod for FlowCacheLine {}
unsafe impl aya::Pod for DecapKey {}
unsafe impl aya::Pod for Counters {}
unsafe impl aya::Pod for LbConfig {}
unsafe impl aya::Pod for FloodState {}
unsafe impl aya::Pod for SockConfig {}
unsafe impl aya::Pod for SockRevKey {}
unsafe impl aya::Pod for SockRevValue {}
