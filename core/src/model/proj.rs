//! Linear projections, `y = x·Wᵀ + b` (PyTorch's `nn.Linear`): the one place that knows how a
//! weight is laid out and how it is multiplied.
//!
//! A [`Proj`]'s weight is `[in, out]`, row-major, as in burn's `Linear`, on every backend and
//! under autodiff alike (so gradients, optimizer state and records look as with burn's module);
//! checkpoints hold Hugging Face's `[out, in]`, converted by [`Proj::from_hf`] and [`to_hf`].
//! Every product goes through [`project`]: the CPU decoding kernel where it applies (Flex, at most
//! [`cpu_decode::MAX_ROWS`] rows, so also a model under `Autodiff<Flex>` after `.valid()`), else
//! one burn matrix product.
//!
//! Precision: weights are f32 today; a half-precision weight would be converted and cast here.

use burn::module::{Module, Param};
use burn::tensor::module::linear;
use burn::tensor::{Tensor, TensorData, backend::Backend};

use super::cpu_decode;
use super::weights::Weights;
use crate::error::Result;

/// A linear projection with an optional bias; see the module docs.
#[derive(Module, Debug)]
pub struct Proj<B: Backend> {
    /// `[in, out]` (see the module docs for the memory layout).
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Proj<B> {
    /// Reads `weight` (HF `[out, in]`) and, where the model has one, `bias` from `vb`.
    pub(crate) fn load(vb: &Weights<B>) -> Result<Self> {
        let weight = vb.host("weight")?;
        let bias = match vb.contains("bias") {
            true => Some(vb.host("bias")?),
            false => None,
        };
        Ok(Self::from_hf(weight, bias, vb.device()))
    }

    /// A projection from an f32 weight in HF layout `[out, in]` and an optional bias `[out]`.
    pub fn from_hf(weight: TensorData, bias: Option<TensorData>, device: &B::Device) -> Self {
        let [out_dim, in_dim] = [weight.shape[0], weight.shape[1]];
        let hf = weight.into_vec::<f32>().expect("f32 weight");
        let weight = TensorData::new(transpose(&hf, out_dim, in_dim), [in_dim, out_dim]);
        let bias = bias.map(|b| Param::from_tensor(Tensor::from_data(b, device)));
        Self { weight: Param::from_tensor(Tensor::from_data(weight, device)), bias }
    }

    /// `x · W + b` over the last axis of `[B, T, in]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        project(x, self.weight.val(), self.bias.as_ref().map(Param::val))
    }
}

/// `values` `[rows, cols]` as `[cols, rows]`, both row-major, in cache-sized tiles.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut out = vec![0.0f32; values.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = values[r * cols + c];
                }
            }
        }
    }
    out
}

/// A `[in, out]` weight in Hugging Face's layout `[out, in]`.
pub fn to_hf<B: Backend, const D: usize>(weight: Tensor<B, D>) -> Tensor<B, D> {
    weight.transpose()
}

/// `x · weight + bias` over the last axis of `x` `[B, T, in]`, `weight` `[in, out]`: the CPU
/// decoding kernel where it applies, else one `[B·T, in] × [in, out]` product (backends multiply
/// batched operands one batch at a time, which for decoding would repack the whole weight for
/// every sequence).
pub fn project<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 3> {
    let [batch, seq, _] = x.dims();
    let x = x.flatten::<2>(0, 1);
    let y = match cpu_decode::matmul(&x, &weight) {
        Some(y) => match bias {
            Some(bias) => y + bias.unsqueeze(),
            None => y,
        },
        None => linear(x, weight, bias),
    };
    let out = y.dims()[1];
    y.reshape([batch, seq, out])
}
