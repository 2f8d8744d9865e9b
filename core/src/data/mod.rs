//! Training data: samples and batches, pre-training packing and mixtures (rows read through the
//! [`Task`](crate::tasks::Task) interface), SFT chat rows and their sources (JSONL or Parquet,
//! chosen columns, the held-out split).

pub mod chat;
#[cfg(feature = "tasks")]
pub mod corpus;
pub mod mixture;
pub mod packing;
pub mod sample;
#[cfg(feature = "tasks")]
pub mod sft_source;

pub use sample::{Sample, TrainBatch, collate, collate_packed, collate_rows};
