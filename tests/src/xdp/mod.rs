//! Tools of the XDP kernel tests (BPF_PROG_TEST_RUN): hand-built frames, the strict reading of
//! a frame (the property test's oracle), the randomized property test, and the object's stack
//! frames and call chains against the verifier's 512-byte limit (`stack`).

pub mod frames;
pub mod stack;
pub mod strict;
pub mod xdp_fuzz;

/// Asserts the machine has two CPUs: a test that runs the program on two at once
/// (BPF_PROG_TEST_RUN runs it on the calling thread's CPU) cannot run on one.
pub fn assert_two_cpus() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        cpus >= 2,
        "this test needs two CPUs, the machine has {cpus}"
    );
}

/// Run the calling thread on `cpu` only (BPF_PROG_TEST_RUN runs the program on the caller's
/// CPU).
pub fn pin_to_cpu(cpu: usize) {
    crate::bench::live::pin_to_cpu(0, cpu).unwrap_or_else(|e| panic!("pin to CPU {cpu}: {e}"));
}
