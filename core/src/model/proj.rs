//! Linear projections, `y = x·Wᵀ + b` (PyTorch's `nn.Linear`): the one place that knows how a
//! weight is laid out and how it is multiplied.
//!
//! A [`Proj`]'s weight is `[in, out]`, row-major, as in burn's `Linear`, on every backend and
//! under autodiff alike (so gradients, optimizer state and records look as with burn's module);
//! checkpoints hold Hugging Face's `[out, in]`, converted by [`Proj::from_hf`] and [`to_hf`].
//! Every product goes through [`project`] (or [`project_all`], several weights with one input):
//! the CPU decoding kernel where it applies (Flex, at most [`cpu_decode::MAX_ROWS`] rows, so also
//! a model under `Autodiff<Flex>` after `.valid()`), else one burn matrix product.
//!
//! Precision: a weight keeps the dtype it is built from ([`Proj::from_hf`]: a bf16 checkpoint
//! gives bf16 weights, no f32 copy), and [`project`] casts weight and bias to the dtype of the
//! activations (a no-op when they agree). So an f32 model run on bf16 activations (mixed
//! precision: f32 master weights) multiplies bf16 copies, and under autodiff the gradient flows
//! back through the cast to the f32 weight. A bf16 weight times bf16 activations (a bf16 model)
//! reaches the decoding kernel as bf16 on CPUs with AVX512-BF16 (`cpu_decode_bf16.rs`), never
//! converted to f32.

use burn::module::{Module, Param};
use burn::tensor::module::linear;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};

use super::cpu_decode;
use super::dtype::Dtype;
use super::weights::Weights;
use crate::error::Result;

/// A linear projection with an optional bias; see the module docs.
#[derive(Module, Debug)]
pub struct Proj<B: Backend> {
    /// `[in, out]` (see the module docs for the memory layout).
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The dtype the product's operands are rounded to when the activations stay wider (bf16
    /// for bf16-mixed on a backend with [`Kernels::bf16_products`](super::kernels::Kernels)):
    /// set by [`Qwen2::with_compute_dtype`](super::Qwen2::with_compute_dtype).
    #[module(skip)]
    pub products: Option<Dtype>,
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

    /// A projection from a weight in HF layout `[out, in]` and an optional bias `[out]`, each
    /// kept in its dtype if that is bf16 or f16, else in the device's default float (f32).
    pub fn from_hf(weight: TensorData, bias: Option<TensorData>, device: &B::Device) -> Self {
        let [out_dim, in_dim] = [weight.shape[0], weight.shape[1]];
        let weight = match weight.dtype {
            DType::BF16 => transposed::<half::bf16>(&weight, out_dim, in_dim),
            DType::F16 => transposed::<half::f16>(&weight, out_dim, in_dim),
            _ => transposed::<f32>(&weight.convert_dtype(DType::F32), out_dim, in_dim),
        };
        Self { bias: bias.map(|b| param(b, device)), weight: param(weight, device), products: None }
    }

    /// `x · W + b` over the last axis of `[B, T, in]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        project_with(x, self.weight.val(), self.bias.as_ref().map(Param::val), self.products)
    }
}

/// A parameter of `data` in its dtype if that is a half one, else in the device's default float.
fn param<B: Backend, const D: usize>(data: TensorData, device: &B::Device) -> Param<Tensor<B, D>> {
    Param::from_tensor(match data.dtype {
        DType::BF16 | DType::F16 => {
            let dtype = data.dtype;
            Tensor::from_data(data, (device, dtype))
        }
        _ => Tensor::from_data(data, device),
    })
}

/// `data` `[rows, cols]` (elements `T`) as `[cols, rows]`.
fn transposed<T: burn::tensor::Element + Copy + Default>(data: &TensorData, rows: usize, cols: usize) -> TensorData {
    TensorData::new(transpose(data.as_slice::<T>().expect("dtype checked by the caller"), rows, cols), [cols, rows])
}

/// `values` `[rows, cols]` as `[cols, rows]`, both row-major, in cache-sized tiles.
fn transpose<T: Copy + Default>(values: &[T], rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 32;
    let mut out = vec![T::default(); values.len()];
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

/// `t` in `dtype` (itself when it already is).
pub fn to_dtype<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype { t } else { t.cast(dtype) }
}

/// A `[in, out]` weight in Hugging Face's layout `[out, in]`.
pub fn to_hf<B: Backend, const D: usize>(weight: Tensor<B, D>) -> Tensor<B, D> {
    weight.transpose()
}

/// Every projection of `projs` applied to the same `x` (a layer's q, k and v, or gate and up):
/// the CPU decoding kernel's one parallel loop for all of them where it applies to each (f32
/// weights and activations, no rounded products: [`cpu_decode::matmul_many`]), else
/// [`Proj::forward`] one by one. The same values either way.
pub fn project_all<B: Backend, const N: usize>(x: Tensor<B, 3>, projs: [&Proj<B>; N]) -> [Tensor<B, 3>; N] {
    let [batch, seq, _] = x.dims();
    let plain = cpu_decode::available::<B>() && x.dtype() == DType::F32 && projs.iter().all(|p| p.products.is_none());
    let many = plain
        .then(|| {
            let weights: [Tensor<B, 2>; N] = projs.map(|p| p.weight.val());
            cpu_decode::matmul_many(&x.clone().flatten::<2>(0, 1), &weights.each_ref())
        })
        .flatten();
    match many {
        Some(ys) => {
            let mut ys = ys.into_iter();
            projs.map(|p| {
                let bias = p.bias.as_ref().map(|b| to_dtype(b.val(), DType::F32));
                unflattened(with_bias(ys.next().expect("one product per projection"), bias), batch, seq)
            })
        }
        None => projs.map(|p| p.forward(x.clone())),
    }
}

/// `y` `[rows, out]` plus `bias` `[out]` on every row.
fn with_bias<B: Backend>(y: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 2> {
    match bias {
        Some(bias) => y + bias.unsqueeze(),
        None => y,
    }
}

/// `y` `[batch·seq, out]` as `[batch, seq, out]`.
fn unflattened<B: Backend>(y: Tensor<B, 2>, batch: usize, seq: usize) -> Tensor<B, 3> {
    let out = y.dims()[1];
    y.reshape([batch, seq, out])
}

/// `x · weight + bias` over the last axis of `x` `[B, T, in]`, `weight` `[in, out]`, in the dtype
/// of `x` (weight and bias are cast to it): the CPU decoding kernel where it applies, else the
/// CPU's bf16 product for bf16 operands (`fused::bf16_matmul`), else the backend's own f32
/// product where it has one (`Kernels::f32_products`), else one `[B·T, in] × [in, out]` product
/// (backends multiply batched operands one batch at a time, which for decoding would repack the
/// whole weight for every sequence).
pub fn project<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 3> {
    project_with(x, weight, bias, None)
}

/// [`project`], with the operands rounded to `products` (bf16) where that is not the dtype of
/// `x` and the backend has [`Kernels::bf16_products`](super::kernels::Kernels): f32 `x` and
/// weight in, f32 out, each product exact and summed in f32.
pub fn project_with<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>, products: Option<Dtype>) -> Tensor<B, 3> {
    let [batch, seq, _] = x.dims();
    let rounded = products == Some(Dtype::BF16) && x.dtype() == DType::F32 && weight.dtype() == DType::F32;
    let (weight, bias) = (to_dtype(weight, x.dtype()), bias.map(|b| to_dtype(b, x.dtype())));
    let x = x.flatten::<2>(0, 1);
    let kernels = super::kernels::kernels::<B>();
    let bf16_products = kernels.bf16_products.filter(|_| rounded);
    let y = bf16_products
        .and_then(|f| f(x.clone(), weight.clone()))
        .or_else(|| cpu_decode::matmul(&x, &weight))
        .or_else(|| super::fused::bf16_matmul(x.clone(), weight.clone()))
        .or_else(|| kernels.f32_products.filter(|_| !rounded).and_then(|f| f(x.clone(), weight.clone())));
    let y = match y {
        Some(y) => with_bias(y, bias),
        None => linear(x, weight, bias),
    };
    unflattened(y, batch, seq)
}
