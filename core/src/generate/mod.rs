//! Batched generation: the engine, the sampler and stop conditions.

pub mod engine;
pub mod sampler;
pub mod stop;

pub use engine::{Completion, Engine, Progress, SamplingParams};
pub use sampler::{Sampled, Sampler};
pub use stop::{FinishReason, StopCriteria, StopReason, model_eos_ids};
