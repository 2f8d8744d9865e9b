//! Rotary position embedding in Hugging Face's "rotate-half" convention.
//!
//! `burn::nn::RotaryEncoding` rotates interleaved pairs (GPT-J style); Qwen2 rotates the first
//! half of each head against the second half, so we keep our own. The tables follow
//! `transformers`' `Qwen2RotaryEmbedding` bit for bit where f32 allows: `inv_freq` and the angles
//! are computed in f32, cos/sin are cast to the activation dtype when applied.

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

/// cos/sin tables for positions `0..max_positions`, each `[max_positions, head_dim]`.
#[derive(Module, Debug)]
pub struct RotaryEmbedding<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

/// cos/sin gathered for one batch of positions, shaped `[batch, 1, seq, head_dim]` so they
/// broadcast over heads.
#[derive(Debug, Clone)]
pub struct RopeTables<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
}

impl<B: Backend> RotaryEmbedding<B> {
    /// Tables for `head_dim` (even) and base `theta`.
    pub fn new(head_dim: usize, theta: f64, max_positions: usize, device: &B::Device) -> Self {
        let half = head_dim / 2;
        // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in f32.
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(max_positions * head_dim);
        let mut sin = Vec::with_capacity(max_positions * head_dim);
        for position in 0..max_positions {
            // emb = cat(freqs, freqs): both halves of a head share the same angles.
            for _ in 0..2 {
                for &f in &inv_freq {
                    let angle = position as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let shape = [max_positions, head_dim];
        Self {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
        }
    }

    /// Number of positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Gathers the tables for `positions` `[batch, seq]`.
    pub fn tables(&self, positions: Tensor<B, 2, Int>) -> RopeTables<B> {
        let [batch, seq] = positions.dims();
        let head_dim = self.cos.dims()[1];
        let flat = positions.reshape([batch * seq]);
        let gather = |table: &Tensor<B, 2>| {
            table.clone().select(0, flat.clone()).reshape([batch, 1, seq, head_dim])
        };
        RopeTables { cos: gather(&self.cos), sin: gather(&self.sin) }
    }
}

impl<B: Backend> RopeTables<B> {
    /// Rotates `x` `[batch, seq, heads, head_dim]` (sequence-major, as projections produce it).
    pub fn apply_seq_major(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        (super::kernels::kernels::<B>().rope)(x, &self.cos, &self.sin)
    }
}
