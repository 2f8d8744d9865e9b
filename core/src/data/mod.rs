//! Training data: samples and batches, pre-training packing and mixtures (rows read through the
//! [`Task`](crate::tasks::Task) interface), SFT chat rows.

pub mod chat;
#[cfg(feature = "tasks")]
pub mod corpus;
pub mod mixture;
pub mod packing;
pub mod sample;

pub use sample::{Sample, TrainBatch, collate};
