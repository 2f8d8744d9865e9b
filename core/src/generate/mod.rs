//! Batched generation: the engine, the sampler and stop conditions; [`stream`] generates one
//! sample token by token for hosts that read logits back asynchronously (the browser).

pub mod device_sampler;
pub mod engine;
pub mod processors;
pub mod sampler;
pub mod stop;
pub mod stream;

pub use engine::{Completion, Engine, MAX_PREFILL_TOKENS, Progress, SamplingParams, StepTimes, check_prompt, gib_bytes, prefill_group};
pub use processors::Penalties;
pub use sampler::{Sampled, Sampler, uniform};
pub use stop::{FinishReason, StopCriteria, StopReason, model_eos_ids};
pub use stream::Stream;
