//! kiln-core: the backend-generic library behind kiln.
//!
//! Everything here is generic over burn's [`Backend`](burn::tensor::backend::Backend): the Qwen2
//! model and its Hugging Face checkpoints ([`model`]), the tokenizer ([`tokenizer`]) and the
//! batched generation engine ([`generate`]), training ([`train`], [`rl`]) on tasks behind one
//! interface ([`tasks`]), checkpoint evaluation ([`eval`]), files ([`io`]), pass@k
//! ([`metrics`]), SVG charts ([`plot`]) and memory/compute planning ([`plan`]).

pub mod data;
pub mod error;
pub mod eval;
pub mod generate;
pub mod io;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod plot;
pub mod rl;
pub mod tasks;
pub mod train;
pub mod tokenizer;

pub use error::{Error, Result};
