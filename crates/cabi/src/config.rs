//! The environment this library reads, in one place (see docs/CABI.md, "Configuration").
//!
//! - `RUST_LOG`: a `tracing` filter (`RUST_LOG=rdmacm=info,rdma_soft=debug`); the logs go to
//!   stderr, as with our Rust tools. Unset: no logs.
//!
//! The layers below read their own variables, as they do for Rust programs:
//! `RDMACM_DEVICES`, `RDMACM_HA` (rdmacm), `RDMA_SOFT_*` (the device). rdma-core's
//! `RDMAV_DRIVERS`, `RDMAV_FORK_SAFE` and `IBV_FORK_SAFE` have nothing to act on here: there
//! are no providers to load and our memory is never pinned.

use std::sync::Once;

/// Reads the environment once (at the first device or CM call): installs the log
/// subscriber when `RUST_LOG` is set.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Ok(filter) = std::env::var("RUST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
}
