//! Health checks.
