//! Training: the optimizer, learning-rate schedules, objectives, checkpoints, metrics and the
//! loop that ties them together.

pub mod adamw;
pub mod checkpoint;
pub mod metrics;
pub mod objective;
pub mod recipes;
pub mod schedule;
pub mod trainer;

pub use adamw::{AdamW, AdamWConfig};
pub use objective::{NextTokenLoss, Objective};
pub use schedule::{Decay, Schedule};
pub use trainer::{LoopConfig, SavePolicy, Start, train};
