//! The learner's view of responses: a block of `[left-padded prompt | right-padded response]`
//! rows (verl's layout), so response token `j` of every row sits at column `P + j` and the
//! logits that predict the responses are one contiguous slice `[P − 1, P − 1 + R)`. Positions
//! count real tokens only ([`HostBatch::positions`]), so padding changes nothing.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::error::{Error, Result};
use crate::model::{HostBatch, Inputs, Qwen2};

/// Host-side rows of (prompt, response) pairs.
#[derive(Debug, Clone)]
pub struct ResponseLayout {
    pub host: HostBatch,
    /// Width of the prompt part (the longest prompt).
    pub prompt_width: usize,
    /// Width of the response part (the longest response).
    pub response_width: usize,
    /// Response token ids `[rows, R]`, padding 0.
    pub targets: Vec<u32>,
    /// 1 for response tokens, 0 for padding, `[rows, R]`.
    pub mask: Vec<f32>,
}

/// A [`ResponseLayout`] on a device.
#[derive(Debug, Clone)]
pub struct ResponseBatch<B: Backend> {
    pub inputs: Inputs<B>,
    pub targets: Tensor<B, 2, Int>,
    pub mask: Tensor<B, 2>,
    pub prompt_width: usize,
}

impl ResponseLayout {
    /// Lays out `(prompt, response)` pairs; both parts must be non-empty.
    pub fn new(pairs: &[(&[u32], &[u32])], pad_id: u32) -> Result<Self> {
        if pairs.is_empty() {
            return Err(Error::InvalidInput("empty batch".into()));
        }
        if pairs.iter().any(|(p, r)| p.is_empty() || r.is_empty()) {
            return Err(Error::InvalidInput("every prompt and response needs at least one token".into()));
        }
        let prompt_width = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let response_width = pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        let seq = prompt_width + response_width;
        let rows = pairs.len();
        let (mut ids, mut valid) = (Vec::with_capacity(rows * seq), Vec::with_capacity(rows * seq));
        let (mut targets, mut mask) = (Vec::with_capacity(rows * response_width), Vec::with_capacity(rows * response_width));
        for (prompt, response) in pairs {
            let (left, right) = (prompt_width - prompt.len(), response_width - response.len());
            ids.extend(std::iter::repeat_n(pad_id, left).chain(prompt.iter().copied()).chain(response.iter().copied()));
            ids.extend(std::iter::repeat_n(pad_id, right));
            valid.extend(std::iter::repeat_n(false, left).chain(std::iter::repeat_n(true, prompt.len() + response.len())));
            valid.extend(std::iter::repeat_n(false, right));
            targets.extend(response.iter().copied().chain(std::iter::repeat_n(0, right)));
            mask.extend(std::iter::repeat_n(1.0, response.len()).chain(std::iter::repeat_n(0.0, right)));
        }
        Ok(Self { host: HostBatch { batch: rows, seq, ids, valid, documents: None }, prompt_width, response_width, targets, mask })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.host.batch
    }

    /// Real tokens (prompts and responses).
    pub fn tokens(&self) -> usize {
        self.host.valid.iter().filter(|&&v| v).count()
    }

    /// Uploads the layout to `device`.
    pub fn to_device<B: Backend>(&self, device: &B::Device) -> ResponseBatch<B> {
        let shape = [self.rows(), self.response_width];
        let targets: Vec<i64> = self.targets.iter().map(|&t| i64::from(t)).collect();
        ResponseBatch {
            inputs: self.host.to_device(device),
            targets: Tensor::from_data(TensorData::new(targets, shape), device),
            mask: Tensor::from_data(TensorData::new(self.mask.clone(), shape), device),
            prompt_width: self.prompt_width,
        }
    }

    /// A `[rows, R]` host tensor (advantages, log-probs) on `device`.
    pub fn tensor<B: Backend>(&self, values: Vec<f32>, device: &B::Device) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(values, [self.rows(), self.response_width]), device)
    }
}

/// The logits that predict each response token, `[rows, R, V]`, at temperature 1.
pub fn response_logits<B: Backend>(model: &Qwen2<B>, batch: &ResponseBatch<B>) -> Tensor<B, 3> {
    model.logits(response_hidden(model, batch, 1.0))
}

/// The final hidden states `[responses, tokens, D]` that predict the response tokens.
///
/// Divided by the rollouts' `temperature` (not for greedy ones): the head's logits over it are
/// the logits divided by it (Qwen2's LM head has no bias; a head with one is refused at other
/// temperatures by the loss), so the log-probs, entropies and KLs are those of the
/// distribution the rollouts sampled from, as verl's actor (`logits.div_(temperature)`) and TRL
/// (`logits / self.temperature`) compute them.
pub fn response_hidden<B: Backend>(model: &Qwen2<B>, batch: &ResponseBatch<B>, temperature: f32) -> Tensor<B, 3> {
    let hidden = model.forward_hidden(&batch.inputs, None);
    let width = batch.mask.dims()[1];
    let hidden = hidden.narrow(1, batch.prompt_width - 1, width);
    match temperature {
        t if t == 1.0 || t < crate::generate::sampler::GREEDY_BELOW => hidden,
        t => hidden.div_scalar(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_left_responses_right() {
        let layout = ResponseLayout::new(&[(&[5, 6], &[7]), (&[8], &[9, 10, 11])], 0).unwrap();
        assert_eq!((layout.prompt_width, layout.response_width), (2, 3));
        assert_eq!(layout.host.ids, vec![5, 6, 7, 0, 0, 0, 8, 9, 10, 11]);
        assert_eq!(layout.host.positions(), vec![0, 1, 2, 2, 2, 0, 0, 1, 2, 3]);
        assert_eq!(layout.targets, vec![7, 0, 0, 9, 10, 11]);
        assert_eq!(layout.mask, vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        assert_eq!(layout.tokens(), 7);
        assert!(ResponseLayout::new(&[(&[5], &[])], 0).is_err());
    }
}
