//! Hugging Face's rotate-half RoPE as one CubeCL kernel, forward and backward.
//!
//! With `h = d/2`, `y_j = x_j·cos_j − x_{j+h}·sin_j` for `j < h` and `x_j·cos_j + x_{j−h}·sin_j`
//! above; the backward pass is the same shape of kernel: `dx_j = dy_j·cos_j + dy_{j+h}·sin_{j+h}`
//! for `j < h` and `dy_j·cos_j − dy_{j−h}·sin_{j−h}` above. Computed in the activations' dtype
//! with the (f32) tables rounded to it, as transformers computes it in half precision.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::{BoolElement, CubeRuntime, tensor::CubeTensor};
use super::{Fused, custom, float, grid, retype, wrap};
use crate::model::custom_op::{self, value};
use crate::model::kernels::rope_reference;

mod kernel {
    use cubecl::prelude::*;

    /// One element of `out` per unit: `x` and `out` `[B, T, n, d]`, `cos`, `sin` `[B, 1, T, d]`, all
    /// contiguous.
    #[cube(launch)]
    pub fn rope_kernel<F: Float>(x: &Tensor<F>, cos: &Tensor<f32>, sin: &Tensor<f32>, out: &mut Tensor<F>, #[comptime] backward: bool, #[define(F)] _dtype: StorageType) {
        let pos = ABSOLUTE_POS;
        if pos >= out.len() {
            terminate!();
        }
        let d = x.shape(3);
        let half = d / 2;
        let j = pos % d;
        // The table row: (b, t) of element (b, t, head, j).
        let row = pos / d / x.shape(2);
        let first = j < half;
        let partner_j = select(first, j + half, j - half);
        let partner = pos - j + partner_j;
        let c = cos[row * d + j];
        let mut s = sin[row * d + j];
        // Forward: −x_{j+h} in the first half; backward: −dy_{j−h} in the second.
        let mut negative = first;
        if backward {
            s = sin[row * d + partner_j];
            negative = !first;
        }
        let other = x[partner] * F::cast_from(s);
        let own = x[pos] * F::cast_from(c);
        out[pos] = select(negative, own - other, own + other);
    }
}

/// Launches [`kernel::rope_kernel`] on CubeCL tensors.
fn launch<R: CubeRuntime>(x: CubeTensor<R>, cos: CubeTensor<R>, sin: CubeTensor<R>, backward: bool) -> CubeTensor<R> {
    let (x, cos, sin) = (into_contiguous(x), into_contiguous(cos), into_contiguous(sin));
    let out = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), x.meta.shape().clone(), x.dtype);
    let (count, dim) = grid(&x.client, x.meta.num_elements());
    let dtype = x.dtype;
    kernel::rope_kernel::launch::<R>(&out.client.clone(), count, dim, x.into_tensor_arg(), cos.into_tensor_arg(), sin.into_tensor_arg(), out.clone().into_tensor_arg(), backward, dtype.into());
    out
}

/// RoPE of `x` on `Fused<R, BT>` as one operation of its fusion stream (`backward`: the
/// transposed rotation, for gradients).
fn apply<R: CubeRuntime, BT: BoolElement>(x: Tensor<Fused<R, BT>, 4>, cos: Tensor<Fused<R, BT>, 4>, sin: Tensor<Fused<R, BT>, 4>, backward: bool) -> Tensor<Fused<R, BT>, 4> {
    let out = (x.shape(), x.dtype());
    let mut outputs = custom::<R, BT, 4>(if backward { "rope_backward" } else { "rope" }, vec![x, cos, sin], &[out], move |inputs| {
        let [x, cos, sin]: [CubeTensor<R>; 3] = inputs.try_into().expect("three inputs");
        vec![launch(x, cos, sin, backward)]
    });
    wrap(outputs.remove(0))
}

/// [`super::super::kernels::Kernels::rope`] on `Fused<R, BT>` (plain or under autodiff); the
/// reference where the kernel does not apply.
pub fn rope<B: Backend, R: CubeRuntime, BT: BoolElement>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, seq, _, d] = x.dims();
    if !float(x.dtype()) || d % 2 != 0 || cos.dims() != [batch, 1, seq, d] || sin.dims() != [batch, 1, seq, d] {
        return rope_reference(x, cos, sin);
    }
    let (c, s) = (cos.clone().cast(DType::F32), sin.clone().cast(DType::F32));
    if let Some(x) = retype::<B, Fused<R, BT>, 4>(x.clone()) {
        let out = apply(x, retype(c).expect("same backend"), retype(s).expect("same backend"), false);
        return retype(out).expect("same backend");
    }
    tracked::<B, R, BT, NoCheckpointing>(x.clone(), &c, &s)
        .or_else(|| tracked::<B, R, BT, BalancedCheckpointing>(x.clone(), &c, &s))
        .unwrap_or_else(|| rope_reference(x, cos, sin))
}

/// RoPE under `Autodiff<Fused<R, BT>, C>` when that is `B`: the kernel forward, its transpose
/// recorded as the backward pass (the tables are constants).
fn tracked<B: Backend, R: CubeRuntime, BT: BoolElement, C: CheckpointStrategy>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Option<Tensor<B, 4>> {
    type Ad<R, BT, C> = Autodiff<Fused<R, BT>, C>;
    let x = custom_op::tracked(retype::<B, Ad<R, BT, C>, 4>(x)?)?;
    let cos = retype::<B, Ad<R, BT, C>, 4>(cos.clone())?.inner();
    let sin = retype::<B, Ad<R, BT, C>, 4>(sin.clone())?.inner();
    let out = apply(value(&x), cos.clone(), sin.clone(), false);
    retype(custom_op::record::<Ad<R, BT, C>, RopeBackward, 1, 4>(RopeBackward, &[x], || (cos, sin), out)?)
}

#[derive(Debug)]
struct RopeBackward;

impl<R: CubeRuntime, BT: BoolElement> Backward<Fused<R, BT>, 1> for RopeBackward {
    type State = (Tensor<Fused<R, BT>, 4>, Tensor<Fused<R, BT>, 4>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        custom_op::backward::<Fused<R, BT>, _, 1, 4, 4>(ops, grads, |(cos, sin), grad, _| [Some(apply(grad, cos, sin, true))]);
    }
}
