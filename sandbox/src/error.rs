//! Typed errors of the sandbox.

use std::path::PathBuf;

/// Everything that can stop the sandbox from being set up or from running a program. A program
/// that misbehaves is not an error: it gets a verdict.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No Python interpreter could be found or used.
    #[error("no usable Python interpreter: {0}")]
    NoPython(String),
    /// Some property a run must be kept to is contained by no working layer here (the text names
    /// each, and the layers that would contain it) and unsafe mode was not asked for.
    #[error(
        "refusing to run untrusted code: nothing here contains {0}; pass --unsafe-no-sandbox to \
         run it anyway"
    )]
    Unconfined(String),
    /// A layer name to leave off that the sandbox does not know (the name, the valid ones).
    #[error("unknown sandbox layer {0:?}: the layers that can be left off are {1}")]
    UnknownLayer(String, String),
    /// A Landlock ABI to enforce outside 1–6 (`SandboxOptions::landlock_abi`).
    #[error("a Landlock ABI to enforce is 1 to 6, not {0}")]
    LandlockAbi(u32),
    /// This operating system has no sandbox implementation.
    #[error("kiln's sandbox runs programs only on Unix; this is {0}")]
    Unsupported(&'static str),
    /// Reading or writing a file of the sandbox failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Starting or supervising a sandboxed process failed.
    #[error("sandboxed process: {0}")]
    Spawn(String),
}

impl SandboxError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
