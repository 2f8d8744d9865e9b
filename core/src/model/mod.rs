//! The Qwen2 model family: config, blocks, KV cache, and Hugging Face checkpoints.

pub mod checkpoint;
pub mod config;
pub mod custom_op;
pub mod chunked_attention;
pub mod cpu_decode;
#[cfg(feature = "cube")]
pub mod cube;
pub mod dtype;
pub mod fused;
pub mod head_loss;
pub mod hf;
pub mod inputs;
pub mod kernels;
pub mod kv_cache;
pub mod logprobs;
pub mod paged_kv;
pub mod proj;
pub mod qwen2;
pub mod rope;
pub mod weights;

pub use config::Qwen2Config;
pub use dtype::Dtype;
pub use inputs::{HostBatch, Inputs};
pub use kv_cache::KvCache;
pub use proj::Proj;
pub use qwen2::Qwen2;
