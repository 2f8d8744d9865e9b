//! Training data: samples and batches, pre-training packing and mixtures, SFT chat rows.

pub mod chat;
pub mod interplay;
pub mod mixture;
pub mod packing;
pub mod sample;

pub use sample::{Sample, TrainBatch, collate};
