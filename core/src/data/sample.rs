//! Training samples (token ids with their loss targets) and their collation into batches.

use burn::tensor::{Bool, Int, Tensor, TensorData, backend::Backend};

use crate::model::{HostBatch, Inputs};

/// One training sequence: `targets[i]` says whether `ids[i]` is predicted (is a label) from the
/// tokens before it. The first token never is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub ids: Vec<u32>,
    pub targets: Vec<bool>,
}

impl Sample {
    /// A pre-training sample: every token after the first is a target.
    pub fn all_targets(ids: Vec<u32>) -> Self {
        let targets = (0..ids.len()).map(|i| i > 0).collect();
        Self { ids, targets }
    }

    /// Number of tokens in the loss.
    pub fn num_targets(&self) -> usize {
        self.targets.iter().skip(1).filter(|&&t| t).count()
    }
}

/// A right-padded micro-batch on device: model inputs, next-token labels and their mask.
#[derive(Debug, Clone)]
pub struct TrainBatch<B: Backend> {
    pub inputs: Inputs<B>,
    /// `[B, T]`: the token at position t + 1 (pad at the end).
    pub labels: Tensor<B, 2, Int>,
    /// `[B, T]`: whether position t's prediction is in the loss.
    pub label_mask: Tensor<B, 2, Bool>,
    /// Number of true entries of `label_mask`.
    pub num_targets: usize,
    /// Real (non-padding) tokens.
    pub num_tokens: usize,
}

/// Right-pads `samples` with `pad_id` into one micro-batch on `device`.
pub fn collate<B: Backend>(samples: &[Sample], pad_id: u32, device: &B::Device) -> crate::Result<TrainBatch<B>> {
    // One sample per row: `HostBatch::packed` is `right_padded` there.
    collate_rows(&samples.iter().map(std::slice::from_ref).collect::<Vec<_>>(), pad_id, device)
}

/// Packs `samples` into one row without padding (padding-free: TRL's `padding_free`):
/// concatenated in order, positions restarting at each sample, attention within each sample
/// only, and no label across a boundary. The loss over its targets is the padded batch's
/// ([`collate`]).
pub fn collate_packed<B: Backend>(samples: &[Sample], pad_id: u32, device: &B::Device) -> crate::Result<TrainBatch<B>> {
    collate_rows(&[samples], pad_id, device)
}

/// One micro-batch of `rows`, each row its samples packed as [`collate_packed`] does, the rows
/// right-padded with `pad_id` to the longest (LLaMA-Factory's `neat_packing`).
pub fn collate_rows<B: Backend, R: AsRef<[Sample]>>(rows: &[R], pad_id: u32, device: &B::Device) -> crate::Result<TrainBatch<B>> {
    let docs: Vec<Vec<&[u32]>> = rows.iter().map(|row| row.as_ref().iter().map(|s| s.ids.as_slice()).collect()).collect();
    let host = HostBatch::packed(&docs, pad_id)?;
    let rows: Vec<&[Sample]> = rows.iter().map(AsRef::as_ref).collect();
    Ok(upload(host, &rows, pad_id, device))
}

/// `host`'s labels and mask from its `rows` of samples (each row the samples laid end to end).
fn upload<B: Backend>(host: HostBatch, rows: &[&[Sample]], pad_id: u32, device: &B::Device) -> TrainBatch<B> {
    let (batch, seq) = (host.batch, host.seq);
    let mut labels = vec![pad_id as i64; batch * seq];
    let mut mask = vec![false; batch * seq];
    for (b, samples) in rows.iter().enumerate() {
        let mut at = b * seq;
        for sample in samples.iter() {
            for t in 0..sample.ids.len().saturating_sub(1) {
                labels[at + t] = sample.ids[t + 1] as i64;
                mask[at + t] = sample.targets[t + 1];
            }
            at += sample.ids.len();
        }
    }
    let num_targets = mask.iter().filter(|&&m| m).count();
    TrainBatch {
        inputs: host.to_device(device),
        labels: Tensor::from_data(TensorData::new(labels, [batch, seq]), device),
        label_mask: Tensor::from_data(TensorData::new(mask, [batch, seq]), device),
        num_targets,
        num_tokens: rows.iter().copied().flatten().map(|s| s.ids.len()).sum(),
    }
}
