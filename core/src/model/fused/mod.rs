//! Fused CPU kernels for the Flex backend (f32), with their backward passes under
//! `Autodiff<Flex>`: the parts of a Qwen2 block that burn runs as chains of single-threaded
//! elementwise ops (attention's mask, softmax and transposes; see `benches/README.md`).
//!
//! Each entry point takes and returns burn tensors of any backend and answers `None` when it does
//! not apply (another backend, a dtype other than f32, or the `flex` feature off); the caller
//! then runs burn's ops. Kernels dispatch on CPU features at run time ([`simd::level`]) and
//! run on rayon's pool.

#[cfg(feature = "flex")]
pub mod attention;
#[cfg(feature = "flex")]
pub mod elementwise;
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
pub mod gemm_bf16;
#[cfg(feature = "flex")]
pub mod matmul;
pub mod simd;

use std::sync::Arc;

use burn::tensor::{Tensor, backend::Backend};

/// Which keys are real tokens, host-side: `[batch, keys]`, 0 = padding, else the key's
/// document (1 for every real token without packing; equal labels are one document of a packed
/// row). Built once per forward pass and shared by every layer.
#[derive(Debug, Clone)]
pub struct KeyMask {
    pub batch: usize,
    pub keys: usize,
    pub valid: Arc<Vec<u32>>,
}

/// Whether the fused kernels run on backend `B` (Flex, or Flex under autodiff).
pub fn available<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    return flex::is_flex::<B>() || flex::is_autodiff_flex::<B>();
    #[cfg(not(feature = "flex"))]
    false
}

/// Whether `B` is the Flex backend itself (not under autodiff).
pub fn is_flex<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    return flex::is_flex::<B>();
    #[cfg(not(feature = "flex"))]
    false
}

/// Causal grouped-query attention (see `attention.rs` for the masking rule): `q` `[B, T, H, d]`,
/// `k` and `v` `[B, S, K, d]`, the output `[B, T, H, d]`, scores scaled by `1/√d`.
pub fn attention<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: &KeyMask) -> Option<Tensor<B, 4>> {
    #[cfg(feature = "flex")]
    return flex::attention(q, k, v, mask);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (q, k, v, mask);
        None
    }
}

/// `buffer[.., start..start + n, ..] = value` along axis `dim` (`n` = `value`'s length there),
/// written into `buffer`'s own memory when it is a Flex tensor nothing else holds, laid out densely
/// (burn-flex's `slice_assign` copies the whole buffer first). `Err` gives both back untouched
/// where that does not apply (another backend, a shared or strided buffer, another dtype).
#[allow(clippy::result_large_err)]
pub fn write_in_place<B: Backend>(buffer: Tensor<B, 4>, dim: usize, start: usize, value: Tensor<B, 4>) -> Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>)> {
    #[cfg(feature = "flex")]
    return flex::write_in_place(buffer, dim, start, value);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (dim, start);
        Err((buffer, value))
    }
}

/// [`write_in_place`] where it applies, else burn's `slice_assign` of the same range (in place
/// on CubeCL when nothing else holds the buffer): `buffer[.., start..start + n, ..] = value`
/// along axis `dim`.
pub fn assign<B: Backend>(buffer: Tensor<B, 4>, dim: usize, start: usize, value: Tensor<B, 4>) -> Tensor<B, 4> {
    match write_in_place(buffer, dim, start, value) {
        Ok(written) => written,
        Err((buffer, value)) => {
            let mut ranges = buffer.dims().map(|n| 0..n);
            ranges[dim] = start..start + value.dims()[dim];
            buffer.slice_assign(ranges, value)
        }
    }
}

/// One row of [`gather_rows`]: positions `from..` of batch row `row` of source `source`,
/// written from position `at` of the output row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpec {
    pub source: usize,
    pub row: usize,
    pub from: usize,
    pub at: usize,
}

/// Rows of KV-cache layers (`[b, S, K, d]` views, each batch row's positions dense) gathered into
/// a new `[rows.len(), capacity, K, d]` buffer in one copy, zeros wherever no row writes; `None`
/// where that does not apply (another backend, dtype or layout), for the caller's burn ops.
pub fn gather_rows<B: Backend>(sources: &[Tensor<B, 4>], rows: &[RowSpec], capacity: usize) -> Option<Tensor<B, 4>> {
    #[cfg(feature = "flex")]
    return flex::gather_rows(sources, rows, capacity);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (sources, rows, capacity);
        None
    }
}

/// `silu(gate) · up` (SwiGLU's gating), any shape.
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Option<Tensor<B, D>> {
    #[cfg(feature = "flex")]
    return flex::swiglu(gate, up);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (gate, up);
        None
    }
}

/// Rotary embedding (Hugging Face's rotate-half) of `x` `[B, T, n, d]` with `cos`, `sin`
/// `[B, 1, T, d]` (constants).
pub fn rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Option<Tensor<B, 4>> {
    #[cfg(feature = "flex")]
    return flex::rope(x, cos, sin);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (x, cos, sin);
        None
    }
}

/// Whether [`bf16_products`] runs on backend `B` on this CPU (Flex or Flex under autodiff, with
/// AVX512-BF16).
pub fn bf16_products_available<B: Backend>() -> bool {
    available::<B>() && cpu_bf16_products()
}

/// Whether this CPU has the instructions [`bf16_products`] needs (AVX512-BF16; `KILN_SIMD` not
/// capping it), whatever the backend.
pub fn cpu_bf16_products() -> bool {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    return gemm_bf16::available();
    #[cfg(not(all(feature = "flex", target_arch = "x86_64")))]
    false
}

/// `x · w` of f32 `x` `[m, k]` and `w` `[k, n]` with both operands rounded to bf16, the products
/// summed in f32 and returned in f32; under autodiff both gradients are computed the same way
/// (`dx = dy · wᵀ`, `dw = xᵀ · dy`, f32 out). `None` where [`bf16_products_available`] is false.
pub fn bf16_products<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    return flex::bf16_products(x, w);
    #[cfg(not(all(feature = "flex", target_arch = "x86_64")))]
    {
        let _ = (x, w);
        None
    }
}

/// `x · w` of bf16 `x` `[m, k]` and `w` `[k, n]` (any strides: the tied head's transposed
/// embedding is read in place) on Flex without autodiff (inference), products summed in f32,
/// bf16 out; `None` where [`cpu_bf16_products`] is false or the operands are not bf16.
pub fn bf16_matmul<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    return flex::bf16_matmul(x, w);
    #[cfg(not(all(feature = "flex", target_arch = "x86_64")))]
    {
        let _ = (x, w);
        None
    }
}

/// `x · w` of f32 `x` `[m, k]` and `w` `[k, n]` on Flex or Flex under autodiff through
/// [`matmul`] (burn-flex's kernel without zeroing the output), the gradients (`dx = dy · wᵀ`,
/// `dw = xᵀ · dy`) likewise; `None` for another backend or dtype, and under autodiff for
/// operands that are not contiguous (on Flex, [`f32_matmul`] reads any strides in place).
pub fn f32_products<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    #[cfg(feature = "flex")]
    return flex::f32_products(x, w);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (x, w);
        None
    }
}

/// `x · w` of f32 `x` `[m, k]` and `w` `[k, n]` (any non-negative strides, read in place) on
/// Flex without autodiff, through [`matmul`]; `None` for another backend or dtype.
pub fn f32_matmul<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    #[cfg(feature = "flex")]
    return flex::f32_matmul(x, w);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (x, w);
        None
    }
}

/// RMSNorm over the last axis: `x / √(mean(x²) + eps) · weight`.
pub fn rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, eps: f64) -> Option<Tensor<B, D>> {
    #[cfg(feature = "flex")]
    return flex::rms_norm(x, weight, eps);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (x, weight, eps);
        None
    }
}

/// `log_softmax(logits)[b, t, targets[b, t]]`: `[B, T, V]` → `[B, T]`, `targets` row-major
/// `[B, T]` on the host.
pub fn token_logprobs<B: Backend>(logits: Tensor<B, 3>, targets: &[u32]) -> Option<Tensor<B, 2>> {
    #[cfg(feature = "flex")]
    return flex::token_logprobs(logits, targets);
    #[cfg(not(feature = "flex"))]
    {
        let _ = (logits, targets);
        None
    }
}

/// One AdamW update of a flattened parameter on Flex (no autodiff): `(param, exp_avg,
/// exp_avg_sq)` after the step, bit-identical to `train::adamw`'s burn ops; `moments` `None`
/// starts them at zero.
#[cfg(feature = "flex")]
pub fn adamw<B: Backend>(
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    step: elementwise::AdamWStep,
) -> Option<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>)> {
    flex::adamw(param, grad, moments, step)
}

#[cfg(feature = "flex")]
mod flex;

#[cfg(all(test, feature = "flex"))]
mod tests;
