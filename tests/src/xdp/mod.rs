//! Tools of the XDP kernel tests (BPF_PROG_TEST_RUN): hand-built frames, the strict reading of
//! a frame (the property test's oracle) and the randomized property test.

pub mod frames;
pub mod strict;
pub mod xdp_fuzz;
