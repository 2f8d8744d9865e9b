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
    let rows: Vec<Vec<u32>> = samples.iter().map(|s| s.ids.clone()).collect();
    let host = HostBatch::right_padded(&rows, pad_id)?;
    let (batch, seq) = (host.batch, host.seq);
    let mut labels = vec![pad_id as i64; batch * seq];
    let mut mask = vec![false; batch * seq];
    for (b, sample) in samples.iter().enumerate() {
        for t in 0..sample.ids.len().saturating_sub(1) {
            labels[b * seq + t] = sample.ids[t + 1] as i64;
            mask[b * seq + t] = sample.targets[t + 1];
        }
    }
    let num_targets = mask.iter().filter(|&&m| m).count();
    Ok(TrainBatch {
        inputs: host.to_device(device),
        labels: Tensor::from_data(TensorData::new(labels, [batch, seq]), device),
        label_mask: Tensor::from_data(TensorData::new(mask, [batch, seq]), device),
        num_targets,
        num_tokens: samples.iter().map(|s| s.ids.len()).sum(),
    })
}
