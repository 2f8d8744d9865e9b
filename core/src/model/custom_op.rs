//! Operations with their own backward pass on any backend under burn's `Autodiff` (the pattern
//! of burn's `examples/custom-cubecl-kernel`, written once for every inner backend): the
//! forward pass runs on the inner backend, the backward pass is a burn-autodiff [`Backward`].
//! Used by the chunked LM head ([`super::head_loss`]) and chunked attention
//! ([`super::chunked_attention`]).

use std::any::{Any, TypeId};

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// The backend under autodiff.
pub type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A float tensor of burn's `Autodiff<Inner<B>>`: the inner value and its graph node.
pub type Tracked<B> = FloatTensor<Autodiff<Inner<B>>>;

/// `value` as type `T` when it is one (a backend's primitive, by type identity).
pub fn cast<T: 'static>(value: impl Any) -> Option<T> {
    let boxed: Box<dyn Any> = Box::new(value);
    boxed.downcast::<T>().ok().map(|b| *b)
}

/// Which checkpointing strategy `B` is burn's `Autodiff` with; `None` for any other backend.
fn strategy<B: AutodiffBackend>() -> Option<bool> {
    let is = |c: TypeId| TypeId::of::<B>() == c;
    if is(TypeId::of::<Autodiff<Inner<B>, NoCheckpointing>>()) {
        Some(false)
    } else if is(TypeId::of::<Autodiff<Inner<B>, BalancedCheckpointing>>()) {
        Some(true)
    } else {
        None
    }
}

/// The tracked primitive of `t` when `B` is burn's `Autodiff` (either strategy).
pub fn tracked<B: AutodiffBackend, const D: usize>(t: Tensor<B, D>) -> Option<Tracked<B>> {
    strategy::<B>()?;
    cast(t.into_primitive().tensor())
}

/// The inner value of a tracked primitive as a tensor.
pub fn value<I: Backend, const D: usize>(t: &FloatTensor<Autodiff<I>>) -> Tensor<I, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t.primitive.clone()))
}

/// Records `op` with parents `inputs` and output `output` (computed on the inner backend);
/// `state()` (what the backward pass needs) is only built when a parent needs a gradient.
pub fn record<B: AutodiffBackend, O: Backward<Inner<B>, N>, const N: usize, const D: usize>(
    op: O,
    inputs: &[Tracked<B>; N],
    state: impl FnOnce() -> O::State,
    output: Tensor<Inner<B>, D>,
) -> Option<Tensor<B, D>> {
    fn finish<I: Backend, O: Backward<I, N>, C: CheckpointStrategy, const N: usize>(
        op: O,
        inputs: &[FloatTensor<Autodiff<I>>; N],
        state: impl FnOnce() -> O::State,
        output: FloatTensor<I>,
    ) -> FloatTensor<Autodiff<I>> {
        let nodes = inputs.clone().map(|t| t.node);
        match op.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(state(), output),
            OpsKind::UnTracked(prep) => prep.finish(output),
        }
    }
    let output = output.into_primitive().tensor();
    let out = match strategy::<B>()? {
        false => finish::<Inner<B>, O, NoCheckpointing, N>(op, inputs, state, output),
        true => finish::<Inner<B>, O, BalancedCheckpointing, N>(op, inputs, state, output),
    };
    Some(Tensor::from_primitive(TensorPrimitive::Float(cast::<B::FloatTensorPrimitive>(out)?)))
}

/// The backward pass of an op with `N` parents: the output's gradient (rank `E`) in, the
/// parents' gradients (rank `D`) from `gradients(state, output gradient, which parents need
/// one)` registered for those that do.
pub fn backward<B: Backend, S, const N: usize, const E: usize, const D: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    gradients: impl FnOnce(S, Tensor<B, E>, [bool; N]) -> [Option<Tensor<B, D>>; N],
) {
    let grad = Tensor::<B, E>::from_primitive(TensorPrimitive::Float(grads.consume::<B>(&ops.node)));
    let wanted = ops.parents.clone().map(|p| p.is_some());
    for (node, g) in ops.parents.into_iter().zip(gradients(ops.state, grad, wanted)) {
        if let (Some(node), Some(g)) = (node, g) {
            grads.register::<B>(node.id, g.into_primitive().tensor());
        }
    }
}

/// Adds the chunked attention with its own backward pass to backend `B`'s kernel table
/// ([`super::kernels`]; once per backend type: the training loop does it before its first step),
/// and with burn's `BalancedCheckpointing` (`[train] recompute`) the layers' checkpoints
/// ([`super::checkpoint`]).
pub fn install<B: AutodiffBackend>() {
    let table = super::kernels::kernels::<B>();
    let layer_checkpoints = strategy::<B>() == Some(true);
    if table.chunked_attention.is_none() || table.layer_checkpoints != layer_checkpoints {
        super::kernels::set(super::kernels::Kernels { chunked_attention: Some(super::chunked_attention::attention::<B>), layer_checkpoints, ..table.clone() });
    }
}
