//! Tasks: synthetic data generation, the model-facing text formats, answer and process scoring,
//! and RL rewards, each a faithful port of the reference implementation it replaces.

pub mod code;
pub mod interplay;
