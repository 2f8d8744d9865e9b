//! The model's kernel seam: one table of the operations a backend may run its own way (RMSNorm,
//! SwiGLU, RoPE, token log-probs, attention's form, the AdamW step), chosen once per backend
//! type, as mistral.rs gives every linear layer one `QuantMethod`. A new implementation is one
//! table; the model calls `kernels::<B>()` and never asks which backend it runs on.
//!
//! - [`REFERENCE`]: plain burn ops, what every backend runs unless it has its own (wgpu and CUDA
//!   compile them to CubeCL kernels), and what every other table is tested against;
//! - the CubeCL table ([`super::cube`], burn's wgpu and CUDA backends with fusion): kiln's own
//!   CubeCL kernels where burn's fusion leaves several kernels (RoPE, the AdamW step), the
//!   reference for the rest;
//! - the Flex table: `model::fused`'s CPU kernels (f32), each falling back to the reference
//!   where it declines (another dtype), and bf16 products on CPUs with AVX512-BF16;
//! - under autodiff, [`custom_op::install`](super::custom_op::install) adds the chunked
//!   attention with its own backward pass (training).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::{DType, Int, Tensor, backend::Backend};

use super::fused;
use super::proj::to_dtype;

/// [`super::chunked_attention::attention`] as a function pointer.
pub type AttentionFn<B> = fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, &Tensor<B, 2, Int>, usize) -> Option<Tensor<B, 4>>;

/// Attention of q `[B, H, T, d]` over k, v `[B, K, S, d]` (GQA by grouping, causal aligned
/// bottom-right, the keys' labels `[B, S]` as [`super::chunked_attention::chunk_mask`] reads
/// them), with its own backward pass under autodiff; `None` where declined.
pub type FlashFn<B> = fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, &Tensor<B, 2, Int>) -> Option<Tensor<B, 4>>;

/// One AdamW update of a flattened f32 parameter (see `train::adamw`): the constants of step `t`.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    /// Gradient-clipping coefficient.
    pub clip: Option<f32>,
    /// Decoupled weight decay factor `1 - lr·wd`.
    pub decay: Option<f32>,
    /// `1 - β1`.
    pub w: f32,
    pub beta2: f32,
    /// `1 - β2`.
    pub one_minus_beta2: f32,
    /// `√(1 - β2^t)`.
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
    /// `lr / (1 - β1^t)`.
    pub step_size: f32,
}

/// `(param, exp_avg, exp_avg_sq)` after one AdamW step, or `None` where the table has no kernel
/// for these tensors (the caller runs `train::adamw`'s burn ops).
pub type AdamWFn<B> = fn(Tensor<B, 1>, Tensor<B, 1>, Option<(Tensor<B, 1>, Tensor<B, 1>)>, AdamWStep) -> Option<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>)>;

/// The operations of one backend; see the module docs.
pub struct Kernels<B: Backend> {
    /// Which implementation: `"reference"`, `"flex"` or `"cubecl"`.
    pub name: &'static str,
    /// Tensors live in host memory: generation samples from the host's logits.
    pub host_memory: bool,
    /// RMSNorm over the last axis, normalised in f32: `x / √(mean(x²) + eps) · weight`.
    pub rms_norm: fn(Tensor<B, 3>, Tensor<B, 1>, f64) -> Tensor<B, 3>,
    /// `silu(gate) · up`.
    pub swiglu: fn(Tensor<B, 3>, Tensor<B, 3>) -> Tensor<B, 3>,
    /// Hugging Face's rotate-half RoPE of `x` `[B, T, n, d]` with `cos`, `sin` `[B, 1, T, d]`.
    pub rope: fn(Tensor<B, 4>, &Tensor<B, 4>, &Tensor<B, 4>) -> Tensor<B, 4>,
    /// `log_softmax(logits)[b, t, targets[b, t]]` in f32: `[B, T, V]` → `[B, T]`.
    pub token_logprobs: fn(Tensor<B, 3>, Tensor<B, 2, Int>) -> Tensor<B, 2>,
    /// Whether attention over activations of this dtype takes the fused CPU kernel
    /// (`fused::attention`: sequence-major heads, the mask never materialised).
    pub fused_attention: fn(DType) -> bool,
    /// Attention over query chunks with its own backward pass, where installed (training).
    pub chunked_attention: Option<AttentionFn<B>>,
    /// Flash attention (no scores tensor), forward and backward, where the backend has it:
    /// taken before the chunked and dense forms.
    pub flash_attention: Option<FlashFn<B>>,
    /// Decoding attention over a paged KV cache in device memory, where the backend has a kernel
    /// for it: then generation keeps its KV cache in blocks on the device
    /// ([`super::paged_kv::PagedKv::on_device`]).
    pub paged_decode: Option<PagedDecodeFn<B>>,
    /// The AdamW step as one kernel, if the backend has one.
    pub adamw: AdamWFn<B>,
    /// Training checkpoints the decoder layers (`[train] recompute`, [`super::checkpoint`]):
    /// set under autodiff with burn's `BalancedCheckpointing` by
    /// [`custom_op::install`](super::custom_op::install).
    pub layer_checkpoints: bool,
    /// Where the backend multiplies bf16 natively on f32 activations (Flex on CPUs with
    /// AVX512-BF16): `x · w` `[m, k] × [k, n]`, both rounded to bf16, summed and returned in f32
    /// (gradients likewise). bf16-mixed then keeps activations in f32 and rounds only what the
    /// products read ([`super::proj::Proj::products`]).
    pub bf16_products: Option<BinaryFn<B>>,
    /// Where the backend has its own f32 product that beats its matmul (Flex: burn-flex's kernel
    /// without zeroing the output, [`fused::f32_products`]): `x · w` `[m, k] × [k, n]` of f32
    /// operands, gradients likewise.
    pub f32_products: Option<BinaryFn<B>>,
}

/// Flash-decoding over a paged KV cache ([`super::paged_kv`]): q `[R, H, d]` (after RoPE), the
/// key and value pools `[N·BLOCK, K, d]`, each row's block table `[R, W]` and count of keys to
/// read `[R]`, the longest count; `[R, H, d]`. `None` where declined.
pub type PagedDecodeFn<B> = fn(Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 2, Int>, Tensor<B, 1, Int>, usize) -> Option<Tensor<B, 3>>;

/// A product of two matrices, or `None` where declined.
pub type BinaryFn<B> = fn(Tensor<B, 2>, Tensor<B, 2>) -> Option<Tensor<B, 2>>;

impl<B: Backend> Clone for Kernels<B> {
    fn clone(&self) -> Self {
        Self { ..*self }
    }
}

/// The reference table: plain burn ops.
pub fn reference<B: Backend>() -> Kernels<B> {
    Kernels {
        name: "reference",
        host_memory: false,
        rms_norm: rms_norm_reference,
        swiglu: |gate, up| silu(gate) * up,
        rope: rope_reference,
        token_logprobs: token_logprobs_reference,
        fused_attention: |_| false,
        chunked_attention: None,
        flash_attention: None,
        paged_decode: None,
        adamw: |_, _, _, _| None,
        layer_checkpoints: false,
        bf16_products: None,
        f32_products: None,
    }
}

/// The Flex table: the fused CPU kernels where they apply, else the reference.
fn flex<B: Backend>() -> Kernels<B> {
    Kernels {
        name: "flex",
        host_memory: true,
        rms_norm: |x, weight, eps| fused::rms_norm(x.clone(), weight.clone(), eps).unwrap_or_else(|| rms_norm_reference(x, weight, eps)),
        swiglu: |gate, up| fused::swiglu(gate.clone(), up.clone()).unwrap_or_else(|| silu(gate) * up),
        rope: |x, cos, sin| fused::rope(x.clone(), cos, sin).unwrap_or_else(|| rope_reference(x, cos, sin)),
        token_logprobs: |logits, targets| {
            if logits.dtype() == DType::F32 {
                let host: Vec<u32> = targets.clone().into_data().convert::<i64>().iter::<i64>().map(|t| t as u32).collect();
                if let Some(out) = fused::token_logprobs(logits.clone(), &host) {
                    return out;
                }
            }
            token_logprobs_reference(logits, targets)
        },
        fused_attention: |dtype| dtype == DType::F32,
        chunked_attention: None,
        flash_attention: None,
        paged_decode: None,
        adamw: flex_adamw::<B>,
        layer_checkpoints: false,
        bf16_products: fused::bf16_products_available::<B>().then_some(fused::bf16_products::<B> as BinaryFn<B>),
        f32_products: Some(fused::f32_products::<B> as BinaryFn<B>),
    }
}

#[cfg(feature = "flex")]
fn flex_adamw<B: Backend>(param: Tensor<B, 1>, grad: Tensor<B, 1>, moments: Option<(Tensor<B, 1>, Tensor<B, 1>)>, step: AdamWStep) -> Option<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>)> {
    fused::adamw(param, grad, moments, step)
}

#[cfg(not(feature = "flex"))]
fn flex_adamw<B: Backend>(_: Tensor<B, 1>, _: Tensor<B, 1>, _: Option<(Tensor<B, 1>, Tensor<B, 1>)>, _: AdamWStep) -> Option<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>)> {
    None
}

/// RMSNorm as `transformers` computes it: normalise in f32, cast back, then scale.
pub fn rms_norm_reference<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 1>, eps: f64) -> Tensor<B, 3> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let inv_rms = (x.clone().square().mean_dim(2) + eps).sqrt().recip();
    (x * inv_rms).cast(dtype) * to_dtype(weight, dtype).unsqueeze()
}

/// `x·cos + rotate_half(x)·sin` over the last axis, the tables broadcast (any layout whose
/// tables broadcast against `x`).
pub fn rotate_half<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let dtype = x.dtype();
    let half = x.dims()[3] / 2;
    let first = x.clone().narrow(3, 0, half);
    let second = x.clone().narrow(3, half, half);
    let rotated = Tensor::cat(vec![second.neg(), first], 3);
    x * cos.clone().cast(dtype) + rotated * sin.clone().cast(dtype)
}

/// RoPE of sequence-major `x` `[B, T, n, d]` with tables `[B, 1, T, d]`.
pub(crate) fn rope_reference<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, _, seq, head_dim] = cos.dims();
    let swap = |t: &Tensor<B, 4>| t.clone().reshape([batch, seq, 1, head_dim]);
    rotate_half(x, &swap(cos), &swap(sin))
}

fn token_logprobs_reference<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    log_softmax(logits.cast(DType::F32), 2).gather(2, targets.unsqueeze_dim(2)).squeeze_dim(2)
}

type Registry = RwLock<HashMap<TypeId, &'static (dyn Any + Send + Sync)>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The table of backend `B`: chosen on first use (Flex, or Flex under autodiff, takes the Flex
/// table; burn's wgpu and CUDA backends kiln's CubeCL table; every other backend the
/// reference), as changed by [`set`].
pub fn kernels<B: Backend>() -> &'static Kernels<B> {
    if let Some(found) = registry().read().expect("kernel registry").get(&TypeId::of::<B>()) {
        return found.downcast_ref::<Kernels<B>>().expect("registered under its own type");
    }
    let table = if fused::available::<B>() { flex::<B>() } else { cube_table::<B>().unwrap_or_else(reference::<B>) };
    set(table)
}

/// kiln's CubeCL kernels ([`super::cube`]) where `B` is burn's wgpu or CUDA backend, unless
/// `KILN_KERNELS=reference` asks for burn's operations there (to compare, or to step around a
/// kernel on a device it fails on).
fn cube_table<B: Backend>() -> Option<Kernels<B>> {
    #[cfg(feature = "cube")]
    return match std::env::var("KILN_KERNELS").as_deref() {
        Ok("reference") => None,
        _ => super::cube::table::<B>(),
    };
    #[cfg(not(feature = "cube"))]
    None
}

/// Makes `table` backend `B`'s from now on (tables are few and small: the replaced one stays
/// allocated).
pub fn set<B: Backend>(table: Kernels<B>) -> &'static Kernels<B> {
    let table: &'static Kernels<B> = Box::leak(Box::new(table));
    registry().write().expect("kernel registry").insert(TypeId::of::<B>(), table);
    table
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::Distribution;

    fn normal<const D: usize>(shape: [usize; D]) -> Tensor<Flex, D> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
    }

    fn close<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) {
        let err = (a - b.clone()).abs().max().into_scalar();
        let scale = b.abs().max().into_scalar().max(1.0);
        assert!(err <= 1e-5 * scale, "max error {err}");
    }

    #[test]
    fn each_backend_gets_its_table_once() {
        assert_eq!(kernels::<Flex>().name, "flex");
        assert_eq!(kernels::<Autodiff<Flex>>().name, "flex");
        assert!(std::ptr::eq(kernels::<Flex>(), kernels::<Flex>()));
        assert!(kernels::<Flex>().host_memory);
    }

    /// The Flex table against the reference, op by op.
    #[test]
    fn the_flex_table_is_the_reference() {
        let (flex, reference) = (flex::<Flex>(), reference::<Flex>());
        let (x, w) = (normal([2, 5, 24]), normal([24]));
        close((flex.rms_norm)(x.clone(), w.clone(), 1e-6), (reference.rms_norm)(x.clone(), w, 1e-6));
        let up = normal([2, 5, 24]);
        close((flex.swiglu)(x.clone(), up.clone()), (reference.swiglu)(x, up));
        let (q, cos, sin) = (normal([2, 5, 3, 8]), normal([2, 1, 5, 8]), normal([2, 1, 5, 8]));
        close((flex.rope)(q.clone(), &cos, &sin), (reference.rope)(q, &cos, &sin));
        let logits = normal([2, 5, 40]);
        let targets = Tensor::<Flex, 2, Int>::from_data([[1, 39, 0, 7, 7], [3, 2, 1, 0, 38]], &Default::default());
        close((flex.token_logprobs)(logits.clone(), targets.clone()), (reference.token_logprobs)(logits, targets));
        assert!((flex.fused_attention)(DType::F32) && !(flex.fused_attention)(DType::BF16));
        assert!(!(reference.fused_attention)(DType::F32));
    }
}
