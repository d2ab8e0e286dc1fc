//! Connection sync's pure parts that other nodes see: the authenticated datagram ([`wire`],
//! with the MAC left to the caller) and the replay window ([`replay`]).

pub mod replay;
pub mod wire;
