//! What the integration tests share.

use std::path::PathBuf;

/// The crate's directory where the test runs (cargo sets CARGO_MANIFEST_DIR for each test
/// executable it starts), else the compiling checkout's: a cached executable (the pytest run's
/// embedfleet.testing.cargo_tests) may outlive the checkout that compiled it.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}
