//! Verifiable rewards. A [`Reward`] scores one sampled response against its item; the run's
//! task builds it from the `[reward]` section ([`crate::tasks::Task::reward`]), so a new reward
//! (e.g. running code against tests) is added in `tasks/` and nothing here changes. A custom
//! reward can also be handed to [`Signal::Rewards`](super::Signal) directly.

pub use crate::tasks::{Reward, RewardConfig};

/// What a reward scores a response against: a task's [`Item`](crate::tasks::Item) (the name
/// this module gave it before the Task interface, kept for existing code).
pub type Task = crate::tasks::Item;
