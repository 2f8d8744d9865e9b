//! kiln: an inference-and-training core for small and mid-size reasoning language models
//! (the Qwen2 family) on burn.
//!
//! This facade re-exports the backend-generic library ([`kiln_core`]) and backend selection
//! ([`backends`]); the `kiln` binary is its command-line interface.

pub use kiln_backends as backends;
pub use kiln_core::*;
