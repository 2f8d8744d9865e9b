//! kiln's own CubeCL kernels for burn's GPU backends (wgpu and CUDA from one source, fusion on):
//! the operations burn's fusion leaves as several kernels (`benches/fusion_kernels.rs` counts
//! them). They join burn's fusion stream as custom operations ([`custom`], the pattern of
//! burn-vision's), and under autodiff record their own backward pass
//! ([`super::custom_op`]).
//!
//! - RoPE ([`rope`]): one kernel forward and one backward, where burn's ops take four and
//!   seventeen (`rotate_half`'s concatenation stays two slice assignments under fusion);
//! - flash attention ([`attention`]), forward and backward: no `[B, H, T, S]` scores in
//!   training, prefill or decoding;
//! - flash-decoding over a paged KV cache ([`decode`]), split over the key axis;
//! - AdamW ([`adamw`]): one kernel per parameter for the whole update, where burn's ops take
//!   about nine even fused.
//!
//! [`table`] is the kernel table of these backends ([`super::kernels`]): these kernels, and the
//! reference for the rest. Each kernel declines (the caller runs the reference) where it does not
//! apply: another dtype or layout.

mod adamw;
pub mod attention;
pub mod decode;
mod rope;

#[cfg(test)]
pub(crate) mod tests;

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::Arc;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, tensor::CubeTensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::custom_op::cast;
use super::kernels::{Kernels, reference};

/// burn's CubeCL backend with fusion, as `burn::backend::Wgpu` and `Cuda` are built.
pub type Fused<R, BT> = Fusion<CubeBackend<R, f32, i32, BT>>;

type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;
type Runtime<R, BT> = <Cube<R, BT> as FusionBackend>::FusionRuntime;
type Handle<R, BT> = <Runtime<R, BT> as FusionRuntime>::FusionHandle;

/// The kernel table of backend `B` when it is burn's wgpu or CUDA backend (fusion on), plain or
/// under autodiff; `None` for any other backend.
pub fn table<B: Backend>() -> Option<Kernels<B>> {
    #[cfg(feature = "wgpu")]
    if let Some(table) = table_for::<B, burn::backend::wgpu::WgpuRuntime, u32>() {
        return Some(table);
    }
    #[cfg(feature = "cuda")]
    if let Some(table) = table_for::<B, cubecl::cuda::CudaRuntime, u8>() {
        return Some(table);
    }
    None
}

/// The table for `B` when `B` is `Fused<R, BT>` or that under autodiff.
pub fn table_for<B: Backend, R: CubeRuntime, BT: BoolElement>() -> Option<Kernels<B>> {
    let ours = [TypeId::of::<Fused<R, BT>>(), TypeId::of::<Autodiff<Fused<R, BT>, NoCheckpointing>>(), TypeId::of::<Autodiff<Fused<R, BT>, BalancedCheckpointing>>()];
    if !ours.contains(&TypeId::of::<B>()) {
        return None;
    }
    Some(Kernels {
        name: "cubecl",
        rope: rope::rope::<B, R, BT>,
        flash_attention: Some(attention::attention::<B, R, BT>),
        paged_decode: Some(decode::paged_decode::<B, R, BT>),
        adamw: adamw::adamw::<B, R, BT>,
        ..reference::<B>()
    })
}

/// `t` as a tensor of backend `To` when `To` is `From` (by type identity).
pub(crate) fn retype<From: Backend, To: Backend, const D: usize>(t: Tensor<From, D>) -> Option<Tensor<To, D>> {
    if TypeId::of::<From>() != TypeId::of::<To>() {
        return None;
    }
    Some(Tensor::from_primitive(TensorPrimitive::Float(cast(t.into_primitive().tensor())?)))
}

/// Whether this module's kernels take tensors of `dtype`.
fn float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// What a custom operation runs once its inputs exist: their CubeCL tensors in, the outputs'
/// out (in the order of the declared outputs).
type Run<R> = Arc<dyn Fn(Vec<CubeTensor<R>>) -> Vec<CubeTensor<R>> + Send + Sync>;

/// A kernel of this module as one operation of burn's fusion stream.
struct Custom<R: CubeRuntime, BT: BoolElement> {
    desc: CustomOpIr,
    run: Run<R>,
    _bool: PhantomData<BT>,
}

impl<R: CubeRuntime, BT: BoolElement> std::fmt::Debug for Custom<R, BT> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kiln::{}", self.desc.id)
    }
}

impl<R: CubeRuntime, BT: BoolElement> Operation<Runtime<R, BT>> for Custom<R, BT> {
    fn execute(&self, handles: &mut HandleContainer<Handle<R, BT>>) {
        let inputs = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<Cube<R, BT>>(t)).collect();
        let outputs = (self.run)(inputs);
        assert_eq!(outputs.len(), self.desc.outputs.len(), "{}: one tensor per declared output", self.desc.id);
        for (ir, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<Cube<R, BT>>(&ir.id, tensor);
        }
    }
}

/// Registers `run` as operation `name` on the fusion stream of `inputs` (float tensors of one
/// device), with outputs of the given shapes and dtypes; the outputs as tensors.
pub(crate) fn custom<R: CubeRuntime, BT: BoolElement, const D: usize>(
    name: &'static str,
    inputs: Vec<Tensor<Fused<R, BT>, D>>,
    outputs: &[(Shape, DType)],
    run: impl Fn(Vec<CubeTensor<R>>) -> Vec<CubeTensor<R>> + Send + Sync + 'static,
) -> Vec<FusionTensor<Runtime<R, BT>>> {
    let inputs: Vec<FusionTensor<Runtime<R, BT>>> = inputs.into_iter().map(|t| t.into_primitive().tensor()).collect();
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let outputs: Vec<TensorIr> = outputs.iter().map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype)).collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    client.register(streams, OperationIr::Custom(desc.clone()), Custom::<R, BT> { desc, run: Arc::new(run), _bool: PhantomData })
}

/// A fusion tensor as a tensor of `Fused<R, BT>`.
pub(crate) fn wrap<R: CubeRuntime, BT: BoolElement, const D: usize>(t: FusionTensor<Runtime<R, BT>>) -> Tensor<Fused<R, BT>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Elements per unit and the launch grid for `units` independent elements.
fn grid<R: CubeRuntime>(client: &cubecl::prelude::ComputeClient<R>, units: usize) -> (cubecl::CubeCount, cubecl::CubeDim) {
    let dim = cubecl::CubeDim::new(client, units);
    (cubecl::calculate_cube_count_elemwise(client, units, dim), dim)
}
