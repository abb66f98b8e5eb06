//! The tools' logs: `tracing` events of rdmacm-rs (CM decisions, retransmissions, RNR,
//! hostile datagrams ...) on stderr, through a `tracing-subscriber` `EnvFilter`.
//!
//! `RUST_LOG` wins when set (`RUST_LOG=rdma_proto=debug,rdma_soft=trace`); otherwise each
//! `-d` of a tool raises the level: none shows warnings, `-d` debug events (decisions),
//! `-dd` trace events (every packet). Tools whose `-d` means something else (rdma-perf's
//! `-d ib-dev`, as perftest) take `RUST_LOG` only.
//!
//! ```
//! assert_eq!(rdma_tools::log::directive(0), "warn");
//! assert_eq!(rdma_tools::log::directive(1), "debug");
//! assert_eq!(rdma_tools::log::directive(5), "trace");
//! ```

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter `-d` given `debug` times stands for.
pub fn directive(debug: u8) -> &'static str {
    match debug {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    }
}

/// Installs the stderr subscriber for a tool run with `-d` given `debug` times. A
/// `RUST_LOG` that does not parse is reported on stderr and the `-d` level is used.
/// Calling it twice keeps the first.
pub fn init(debug: u8) {
    let fallback = directive(debug);
    let filter = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(s) if !s.trim().is_empty() => EnvFilter::try_new(&s).unwrap_or_else(|e| {
            eprintln!("ignoring RUST_LOG={s}: {e}");
            EnvFilter::new(fallback)
        }),
        _ => EnvFilter::new(fallback),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
