//! Training: the optimizer, learning-rate schedules, checkpoints, metrics and the loop.

pub mod adamw;
pub mod schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use schedule::{Decay, Schedule};
