//! The whole AdamW update of one f32 parameter as one CubeCL kernel (burn's ops take about nine
//! even fused): the same f32 operations in the same order as `train::adamw`'s burn ops and
//! `fused::elementwise::adamw`.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::{BoolElement, CubeRuntime, tensor::CubeTensor};
use super::{Fused, custom, grid, retype, wrap};
use crate::model::kernels::AdamWStep;

mod kernel {
    use cubecl::prelude::*;

    /// The step's constants; `clip` and `decay` are 1 where absent (exact: `x · 1 = x`).
    #[derive(CubeLaunch, CubeType, Clone, Copy)]
    pub struct Constants {
        pub clip: f32,
        pub decay: f32,
        pub w: f32,
        pub beta2: f32,
        pub one_minus_beta2: f32,
        pub bias_correction2_sqrt: f32,
        pub eps: f32,
        pub step_size: f32,
    }

    /// One element per unit; all tensors contiguous, of one length.
    #[cube(launch)]
    pub fn adamw_kernel(
        param: &Tensor<f32>,
        grad: &Tensor<f32>,
        exp_avg: &Tensor<f32>,
        exp_avg_sq: &Tensor<f32>,
        param_out: &mut Tensor<f32>,
        exp_avg_out: &mut Tensor<f32>,
        exp_avg_sq_out: &mut Tensor<f32>,
        k: Constants,
    ) {
        let i = ABSOLUTE_POS;
        if i >= param_out.len() {
            terminate!();
        }
        let g = grad[i] * k.clip;
        let p = param[i] * k.decay;
        let m0 = exp_avg[i];
        let m = m0 + (g - m0) * k.w;
        let v = exp_avg_sq[i] * k.beta2 + (g * k.one_minus_beta2) * g;
        let denom = v.sqrt() / k.bias_correction2_sqrt + k.eps;
        param_out[i] = p - (m / denom) * k.step_size;
        exp_avg_out[i] = m;
        exp_avg_sq_out[i] = v;
    }
}

fn launch<R: CubeRuntime>(inputs: [CubeTensor<R>; 4], k: AdamWStep) -> Vec<CubeTensor<R>> {
    let [p, g, m, v] = inputs.map(into_contiguous);
    let empty = || empty_device_contiguous_dtype(p.client.clone(), p.device.clone(), p.meta.shape().clone(), DType::F32);
    let (p_out, m_out, v_out) = (empty(), empty(), empty());
    let (count, dim) = grid(&p.client, p.meta.num_elements());
    let constants = kernel::ConstantsLaunch::new(
        k.clip.unwrap_or(1.0),
        k.decay.unwrap_or(1.0),
        k.w,
        k.beta2,
        k.one_minus_beta2,
        k.bias_correction2_sqrt,
        k.eps,
        k.step_size,
    );
    let client = p.client.clone();
    kernel::adamw_kernel::launch::<R>(
        &client,
        count,
        dim,
        p.into_tensor_arg(),
        g.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        p_out.clone().into_tensor_arg(),
        m_out.clone().into_tensor_arg(),
        v_out.clone().into_tensor_arg(),
        constants,
    );
    vec![p_out, m_out, v_out]
}

/// [`crate::model::kernels::Kernels::adamw`] on `Fused<R, BT>`: `None` for any other backend or
/// a tensor that is not f32 (the caller runs the burn ops).
pub fn adamw<B: Backend, R: CubeRuntime, BT: BoolElement>(
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    step: AdamWStep,
) -> Option<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>)> {
    let f32s = |t: &Tensor<B, 1>| t.dtype() == DType::F32;
    if !f32s(&param) || !f32s(&grad) || moments.as_ref().is_some_and(|(m, v)| !f32s(m) || !f32s(v)) {
        return None;
    }
    let ours = |t: Tensor<B, 1>| retype::<B, Fused<R, BT>, 1>(t);
    let (param, grad) = (ours(param)?, ours(grad)?);
    let (m, v) = match moments {
        Some((m, v)) => (ours(m)?, ours(v)?),
        None => (grad.zeros_like(), grad.zeros_like()),
    };
    let shape = (param.shape(), DType::F32);
    let outputs = custom::<R, BT, 1>("adamw", vec![param, grad, m, v], &[shape.clone(), shape.clone(), shape], move |inputs| {
        let inputs: [CubeTensor<R>; 4] = inputs.try_into().expect("four inputs");
        launch(inputs, step)
    });
    let [p, m, v]: [_; 3] = outputs.try_into().ok()?;
    let back = |t| retype::<Fused<R, BT>, B, 1>(wrap(t));
    Some((back(p)?, back(m)?, back(v)?))
}
