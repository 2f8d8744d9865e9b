//! What changes a row's logits before a token is drawn, as vLLM's `Sampler.apply_logits_processors`
//! does it (after the raw log-probs are taken, before temperature and truncation): the tokens
//! the row may not draw yet (`min_tokens`: −∞), then the penalties for the tokens it has seen
//! (`vllm/model_executor/layers/utils.py::apply_penalties`): the repetition penalty over the
//! prompt's and the output's tokens (a positive logit times 1/r, another times r), then
//! `frequency × count` and `presence × (count > 0)` subtracted over the output's tokens only.
//!
//! The same rule on the host ([`RowEdits::apply`]) and in burn ops on the device
//! ([`apply_on_device`]): the same f32 operations in the same order (bit-equal on the CPU's burn
//! ops; a GPU compiler may fuse a multiply and a subtraction, which rounds once less).

use std::collections::{HashMap, HashSet};

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::error::{Error, Result};

/// vLLM's `repetition_penalty`, `presence_penalty` and `frequency_penalty` (1, 0 and 0: off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Divides a seen token's positive logit and multiplies a negative one (prompt and output).
    pub repetition: f32,
    /// Subtracted from the logit of every token the output holds.
    pub presence: f32,
    /// Subtracted once per time the output holds a token.
    pub frequency: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self { repetition: 1.0, presence: 0.0, frequency: 0.0 }
    }
}

impl Penalties {
    /// Whether no penalty applies.
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// vLLM's ranges: presence and frequency in [−2, 2], repetition above 0 (all finite).
    pub fn check(&self) -> Result<()> {
        for (name, value) in [("presence_penalty", self.presence), ("frequency_penalty", self.frequency)] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(Error::InvalidInput(format!("{name} must be in [-2, 2] (got {value})")));
            }
        }
        // (vLLM asks only > 0; a penalty whose inverse overflows f32 would make logits NaN)
        if !(self.repetition.is_finite() && self.repetition > 0.0 && self.repetition.recip().is_finite()) {
            return Err(Error::InvalidInput(format!("repetition_penalty must be a finite number above 0 whose inverse is finite (got {})", self.repetition)));
        }
        Ok(())
    }
}

/// The edits of one row: the ids it may not draw and the penalties over its tokens so far.
#[derive(Debug, Clone, Copy)]
pub struct RowEdits<'a> {
    /// Ids set to −∞ (min_tokens: the stop ids and EOS ids).
    pub banned: &'a [u32],
    pub penalties: Penalties,
    /// The prompt's ids (the repetition penalty's).
    pub prompt: &'a [u32],
    /// The ids generated so far.
    pub output: &'a [u32],
}

impl RowEdits<'_> {
    /// Whether the edits leave the logits as they are.
    pub fn is_identity(&self) -> bool {
        self.banned.is_empty() && self.penalties.is_off()
    }

    /// Applies the edits to one row of logits (ids outside it are ignored).
    pub fn apply(&self, logits: &mut [f32]) {
        for &id in self.banned {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let p = self.penalties;
        if p.is_off() {
            return;
        }
        if p.repetition != 1.0 {
            let seen: HashSet<u32> = self.prompt.iter().chain(self.output).copied().collect();
            for id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l *= if *l > 0.0 { 1.0 / p.repetition } else { p.repetition };
                }
            }
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &id in self.output {
            *counts.entry(id).or_default() += 1;
        }
        for (id, count) in counts {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= p.frequency * count as f32;
                *l -= p.presence;
            }
        }
    }
}

/// [`RowEdits::apply`] on the device, one row of `logits` `[rows, V]` (f32) per entry of `rows`.
pub fn apply_on_device<B: Backend>(logits: Tensor<B, 2>, rows: &[RowEdits]) -> Tensor<B, 2> {
    let [count, vocab] = logits.dims();
    assert_eq!(rows.len(), count, "one row of edits per row of logits");
    let device = logits.device();
    let mut logits = logits;
    if rows.iter().any(|r| !r.banned.is_empty()) {
        let banned = per_id_sums::<B>(rows.iter().map(|r| r.banned.iter().map(|&id| (id, 1.0)).collect()), vocab, &device);
        logits = logits.mask_fill(banned.greater_elem(0.0), f32::NEG_INFINITY);
    }
    if rows.iter().all(|r| r.penalties.is_off()) {
        return logits;
    }
    let column = |value: fn(&Penalties) -> f32| {
        let values: Vec<f32> = rows.iter().map(|r| value(&r.penalties)).collect();
        Tensor::<B, 2>::from_data(TensorData::new(values, [count, 1]), (&device, DType::F32)).expand([count, vocab])
    };
    if rows.iter().any(|r| r.penalties.repetition != 1.0) {
        let seen: Tensor<B, 2, Bool> = per_id_sums::<B>(rows.iter().map(|r| r.prompt.iter().chain(r.output).map(|&id| (id, 1.0)).collect()), vocab, &device).greater_elem(0.0);
        let repetition = column(|p| p.repetition);
        let scaling = repetition.clone().mask_where(logits.clone().greater_elem(0.0), repetition.recip());
        logits = logits.clone().mask_where(seen, logits * scaling);
    }
    let counts = per_id_sums::<B>(rows.iter().map(|r| r.output.iter().map(|&id| (id, 1.0)).collect()), vocab, &device);
    let present = counts.clone().greater_elem(0.0).float().cast(DType::F32);
    logits - counts * column(|p| p.frequency) - present * column(|p| p.presence)
}

/// `[rows, V]`: per row, the sum of the values given for each id (ids outside the vocabulary
/// dropped), by one scatter of the rows' lists padded to the longest (id 0, value 0).
fn per_id_sums<B: Backend>(lists: impl Iterator<Item = Vec<(u32, f32)>>, vocab: usize, device: &B::Device) -> Tensor<B, 2> {
    let lists: Vec<Vec<(u32, f32)>> = lists.map(|l| l.into_iter().filter(|&(id, _)| (id as usize) < vocab).collect()).collect();
    let (rows, width) = (lists.len(), lists.iter().map(Vec::len).max().unwrap_or(0).max(1));
    let (mut ids, mut values) = (vec![0i64; rows * width], vec![0f32; rows * width]);
    for (r, list) in lists.iter().enumerate() {
        for (j, &(id, value)) in list.iter().enumerate() {
            (ids[r * width + j], values[r * width + j]) = (id as i64, value);
        }
    }
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, width]), device);
    let values = Tensor::<B, 2>::from_data(TensorData::new(values, [rows, width]), (device, DType::F32));
    Tensor::<B, 2>::zeros([rows, vocab], (device, DType::F32)).scatter(1, ids, values, IndexingUpdateOp::Add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// The host rule, worked by hand: vLLM's order and signs.
    #[test]
    fn penalties_and_bans_as_vllm_applies_them() {
        let mut logits = [2.0, -1.0, 0.5, 3.0, 0.0];
        let edits = RowEdits {
            banned: &[3],
            penalties: Penalties { repetition: 2.0, presence: 0.25, frequency: 0.5 },
            prompt: &[0, 1],
            output: &[2, 2, 1],
        };
        edits.apply(&mut logits);
        // 0: prompt only, 2 / 2; 1: seen, -1 × 2, then once in the output: − 0.5 − 0.25;
        // 2: 0.5 / 2, twice in the output: − 1 − 0.25; 3 banned; 4 untouched.
        assert_eq!(logits, [1.0, -2.75, -1.0, f32::NEG_INFINITY, 0.0]);
    }

    /// The device rule gives the host's logits, row by row, with rows that differ.
    #[test]
    fn the_device_edits_are_the_hosts() {
        let vocab = 300;
        let host: Vec<f32> = (0..3 * vocab).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let prompts: [&[u32]; 3] = [&[1, 5, 5, 299], &[], &[7]];
        let outputs: [&[u32]; 3] = [&[5, 9, 9, 9], &[2, 2], &[]];
        let banned: [&[u32]; 3] = [&[], &[4, 9], &[0]];
        let penalties = Penalties { repetition: 1.3, presence: -0.5, frequency: 0.7 };
        let rows: Vec<RowEdits> = (0..3).map(|r| RowEdits { banned: banned[r], penalties, prompt: prompts[r], output: outputs[r] }).collect();
        let device = Default::default();
        let edited = apply_on_device::<Flex>(Tensor::from_data(TensorData::new(host.clone(), [3, vocab]), &device), &rows);
        let edited: Vec<f32> = edited.into_data().convert::<f32>().into_vec().unwrap();
        for (r, row) in rows.iter().enumerate() {
            let mut want = host[r * vocab..(r + 1) * vocab].to_vec();
            row.apply(&mut want);
            assert_eq!(&edited[r * vocab..(r + 1) * vocab], &want[..], "row {r}");
        }
        assert!(Penalties { presence: 2.5, ..Penalties::default() }.check().is_err());
        assert!(Penalties { repetition: 0.0, ..Penalties::default() }.check().is_err());
        assert!(Penalties { repetition: 1e-45, ..Penalties::default() }.check().is_err(), "1/r overflows");
        assert!(Penalties { frequency: -2.0, repetition: 0.5, ..Penalties::default() }.check().is_ok());
    }
}
