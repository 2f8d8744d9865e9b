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
pub mod simd;

use std::sync::Arc;

use burn::tensor::{Tensor, backend::Backend};

/// Which keys are real tokens, host-side: `[batch, keys]`, 1 = real, 0 = padding. Built once
/// per forward pass and shared by every layer.
#[derive(Debug, Clone)]
pub struct KeyMask {
    pub batch: usize,
    pub keys: usize,
    pub valid: Arc<Vec<u8>>,
}

/// Whether the fused kernels run on backend `B` (Flex, or Flex under autodiff).
pub fn available<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    return flex::is_flex::<B>() || flex::is_autodiff_flex::<B>();
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

#[cfg(feature = "flex")]
mod flex {
    use std::any::{Any, TypeId};

    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, backend::Backend};
    use burn_flex::{Flex, FlexTensor};

    use super::KeyMask;
    use super::attention::{self as kernel, Dims};

    type AdTensor = FloatTensor<Autodiff<Flex>>;

    pub fn is_flex<B: Backend>() -> bool {
        TypeId::of::<B>() == TypeId::of::<Flex>()
    }

    pub fn is_autodiff_flex<B: Backend>() -> bool {
        TypeId::of::<B>() == TypeId::of::<Autodiff<Flex, NoCheckpointing>>()
            || TypeId::of::<B>() == TypeId::of::<Autodiff<Flex, BalancedCheckpointing>>()
    }

    /// The primitive of `t` as type `P` (the backend's own primitive type when `B` is as checked).
    fn primitive<B: Backend, P: 'static, const D: usize>(t: Tensor<B, D>) -> Option<P> {
        let any: Box<dyn Any> = Box::new(t.into_primitive().tensor());
        any.downcast::<P>().ok().map(|p| *p)
    }

    fn tensor<B: Backend, P: 'static, const D: usize>(p: P) -> Tensor<B, D> {
        let any: Box<dyn Any> = Box::new(p);
        let p = any.downcast::<B::FloatTensorPrimitive>().expect("primitive of backend B");
        Tensor::from_primitive(TensorPrimitive::Float(*p))
    }

    /// `t` as a contiguous f32 tensor (a cheap clone when it already is one).
    fn contiguous(t: &FlexTensor) -> Option<FlexTensor> {
        if t.dtype() != DType::F32 {
            return None;
        }
        Some(if t.as_slice::<f32>().is_some() { t.clone() } else { t.to_contiguous() })
    }

    fn f32s(t: &FlexTensor) -> &[f32] {
        t.as_slice::<f32>().expect("contiguous f32")
    }

    fn from_vec(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
        FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
    }

    pub fn attention<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: &KeyMask) -> Option<Tensor<B, 4>> {
        let [batch, queries, heads, head_dim] = q.dims();
        let [_, keys, kv_heads, _] = k.dims();
        let dims = Dims { batch, queries, keys, heads, kv_heads, head_dim };
        if mask.batch != batch || mask.keys != keys || q.dtype() != DType::F32 {
            return None;
        }
        if is_flex::<B>() {
            let [q, k, v] = [q, k, v].map(|t| primitive::<B, FlexTensor, 4>(t).and_then(|t| contiguous(&t)));
            let (q, k, v) = (q?, k?, v?);
            let (out, _) = kernel::forward(dims, f32s(&q), f32s(&k), f32s(&v), &mask.valid, scale(head_dim));
            return Some(tensor::<B, _, 4>(from_vec(out, &[batch, queries, heads, head_dim])));
        }
        if TypeId::of::<B>() == TypeId::of::<Autodiff<Flex, NoCheckpointing>>() {
            return autodiff::<B, NoCheckpointing>(q, k, v, mask, dims);
        }
        if TypeId::of::<B>() == TypeId::of::<Autodiff<Flex, BalancedCheckpointing>>() {
            return autodiff::<B, BalancedCheckpointing>(q, k, v, mask, dims);
        }
        None
    }

    fn scale(head_dim: usize) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }

    /// The saved inputs and results of one forward pass.
    #[derive(Debug, Clone)]
    struct Saved {
        dims: Dims,
        mask: KeyMask,
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        out: FlexTensor,
        lse: std::sync::Arc<Vec<f32>>,
    }

    #[derive(Debug)]
    struct AttentionBackward;

    impl Backward<Flex, 3> for AttentionBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let s = ops.state;
            let grad = grads.consume::<Flex>(&ops.node);
            let grad = contiguous(&grad).expect("f32 gradient");
            let (dq, dk, dv) = kernel::backward(
                s.dims,
                f32s(&s.q),
                f32s(&s.k),
                f32s(&s.v),
                &s.mask.valid,
                scale(s.dims.head_dim),
                f32s(&s.out),
                &s.lse,
                f32s(&grad),
            );
            let Dims { batch, queries, keys, heads, kv_heads, head_dim } = s.dims;
            let [pq, pk, pv] = ops.parents;
            if let Some(node) = pq {
                grads.register::<Flex>(node.id, from_vec(dq, &[batch, queries, heads, head_dim]));
            }
            if let Some(node) = pk {
                grads.register::<Flex>(node.id, from_vec(dk, &[batch, keys, kv_heads, head_dim]));
            }
            if let Some(node) = pv {
                grads.register::<Flex>(node.id, from_vec(dv, &[batch, keys, kv_heads, head_dim]));
            }
        }
    }

    fn autodiff<B: Backend, C: CheckpointStrategy>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        mask: &KeyMask,
        dims: Dims,
    ) -> Option<Tensor<B, 4>> {
        let (q, k, v) = (primitive::<B, AdTensor, 4>(q)?, primitive::<B, AdTensor, 4>(k)?, primitive::<B, AdTensor, 4>(v)?);
        let (qc, kc, vc) = (contiguous(&q.primitive)?, contiguous(&k.primitive)?, contiguous(&v.primitive)?);
        let (out, lse) = kernel::forward(dims, f32s(&qc), f32s(&kc), f32s(&vc), &mask.valid, scale(dims.head_dim));
        let out = from_vec(out, &[dims.batch, dims.queries, dims.heads, dims.head_dim]);
        let result = match AttentionBackward.prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let saved = Saved { dims, mask: mask.clone(), q: qc, k: kc, v: vc, out: out.clone(), lse: lse.into() };
                prep.finish(saved, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        Some(tensor::<B, _, 4>(result))
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests;
