//! The environment this library reads, in one place (see docs/CABI.md, "Configuration").
//!
//! Beyond these, the layers below read their own variables as they do for Rust programs:
//! `RDMACM_DEVICES`, `RDMACM_HA` (rdmacm), `RDMA_SOFT_*` (the device), `RUST_LOG`.

use std::sync::OnceLock;

/// What the environment asked for, read once.
#[derive(Debug, Clone)]
pub struct Config {
    /// `RDMAV_CABI_LOG` (or `RUST_LOG`): a `tracing` filter for logs on stderr.
    pub log: Option<String>,
}

/// The configuration, read at the first call.
pub fn get() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config {
        log: std::env::var("RDMAV_CABI_LOG").ok(),
    })
}
