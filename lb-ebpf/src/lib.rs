#![no_std]
// This file exists so cargo can build lb-ebpf as a (build-)dependency; the program is in main.rs.
