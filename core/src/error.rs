//! Typed errors of the library. Every variant names the file (and where possible the place in it)
//! so that the CLI can turn it into one clear line.

use std::path::{Path, PathBuf};

/// Result alias used across kiln-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kiln-core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file or JSONL line could not be parsed.
    #[error("{}{}: {source}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Json {
        path: PathBuf,
        /// 1-based line number for JSONL files.
        line: Option<usize>,
        #[source]
        source: serde_json::Error,
    },
    /// A model config is readable but not usable (unsupported or inconsistent values).
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    /// A checkpoint does not match the model it is loaded into, or is corrupt.
    #[error("{}: {message}", path.display())]
    Checkpoint { path: PathBuf, message: String },
    /// The tokenizer file could not be loaded or used.
    #[error("{}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    /// A data record is well-formed JSON but not what is expected (missing field, wrong type,
    /// inconsistent with another file).
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Data {
        path: PathBuf,
        /// 1-based line number for JSONL files.
        line: Option<usize>,
        message: String,
    },
    /// Input that is wrong regardless of any file (bad shapes, empty prompts, bad parameters).
    #[error("{0}")]
    InvalidInput(String),
    /// The sandbox that runs model-written programs could not be set up (or refuses to run
    /// unconfined).
    #[cfg(feature = "code")]
    #[error(transparent)]
    Sandbox(#[from] kiln_sandbox::SandboxError),
    /// The device failed, or a tensor would be larger than it allows (the message has the sizes).
    #[error(transparent)]
    Device(#[from] kiln_backends::device::DeviceError),
    /// A data-parallel run stopped: a peer failed, was lost or disagrees (the message names it).
    #[error("{0}")]
    Distributed(String),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Self::Io { path: path.as_ref().to_path_buf(), source }
    }

    /// A JSON error in `path`, at 1-based JSONL `line` if given.
    pub fn json(path: impl AsRef<Path>, line: Option<usize>, source: serde_json::Error) -> Self {
        Self::Json { path: path.as_ref().to_path_buf(), line, source }
    }

    /// A checkpoint error in `path`.
    pub fn checkpoint(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Self::Checkpoint { path: path.as_ref().to_path_buf(), message: message.into() }
    }

    /// A data error in `path`, at 1-based JSONL `line` if given.
    pub fn data(path: impl AsRef<Path>, line: Option<usize>, message: impl Into<String>) -> Self {
        Self::Data { path: path.as_ref().to_path_buf(), line, message: message.into() }
    }

    /// A config error in `path`.
    pub fn config(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Self::Config { path: path.as_ref().to_path_buf(), message: message.into() }
    }
}
