//! The environment this library reads, in one place (see docs/CABI.md, "Configuration").
//!
//! - `RUST_LOG`: a `tracing` filter (`RUST_LOG=rdmacm=info,rdma_soft=debug`); the logs go to
//!   stderr, as with our Rust tools. Unset: no logs.
//!
//! The connection manager's and the devices' settings (`RDMACM_*`, `RDMA_SOFT_*`, see
//! docs/CONFIG.md) come from [`cma_config`], through the same values a Rust program
//! uses (`rdmacm::cm::CmaConfig`, which carries `rdma_soft::SoftConfig`). rdma-core's
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

/// The configuration of the process-wide connection manager and its devices: the
/// environment's, read once by the context ([`rdmacm::cm::CmaConfig::from_env`]).
pub fn cma_config() -> rdmacm::Result<rdmacm::cm::CmaConfig> {
    rdmacm::cm::CmaConfig::from_env()
}
