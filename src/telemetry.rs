//! Structured logging: `RUST_LOG` filters, `--log-format json` switches the
//! output to one JSON object per line for log pipelines.

use std::io::IsTerminal;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber. Without `RUST_LOG` the operator logs at
/// `info` and its dependencies at `warn`.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,ballast=info,kube_runtime=warn"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
            )
            .init(),
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_target(true)
                    .with_ansi(std::io::stdout().is_terminal()),
            )
            .init(),
    }
}
