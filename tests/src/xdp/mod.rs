//! Tools of the XDP kernel tests (BPF_PROG_TEST_RUN): hand-built frames, the strict reading of
//! a frame (the property test's oracle), the randomized property test, and the object's stack
//! frames and call chains against the verifier's 512-byte limit (`stack`).

pub mod frames;
pub mod stack;
pub mod strict;
pub mod xdp_fuzz;
