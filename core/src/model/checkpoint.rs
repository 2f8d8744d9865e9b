//! Per-layer activation checkpointing (`[train] recompute`): the forward pass keeps only each
//! decoder layer's input; the backward pass goes through the layers one at a time, last first,
//! recomputing a layer's forward pass with its graph and back-propagating its output's gradient
//! through it — what `torch.utils.checkpoint` does around every layer under Hugging Face's
//! `gradient_checkpointing`. A step then keeps `L` hidden-sized tensors per token and one
//! layer's activations at a time, instead of every layer's, for one more forward pass of the
//! layers.
//!
//! burn-autodiff cannot run a backward pass inside another (its cleanup locks every graph, the
//! running one included), so the layers are separate backward passes, driven by [`gradients`],
//! the training loop's `loss.backward()`: [`Qwen2::forward_hidden`] under autodiff with
//! checkpointing ([`super::kernels::Kernels::layer_checkpoints`], installed for burn's
//! `BalancedCheckpointing` backends) runs the layers untracked, leaves a tape of their inputs
//! in thread-local storage and continues the graph (final norm, head, loss) from a new leaf.
//! The gradients are the same bits as without checkpointing: every layer is recomputed by the
//! same kernels, and each tensor's gradient sums the same two contributions (`a + b` is
//! commutative; only the order of more terms could differ, and with one forward pass per loss
//! none has more: with several, a tied embedding's gradient sums more terms, in another order).
//!
//! The switch is the backend type (`Autodiff<_, BalancedCheckpointing>`, which
//! `kiln_backends::run_training_with` picks for `recompute`): a trainable model of that type
//! tapes its forward passes, which only [`gradients`] turns into gradients (`loss.backward()`
//! alone would give the layers none).

use std::any::Any;
use std::cell::RefCell;

use burn::module::{Module, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};

use super::qwen2::{AttnMask, Qwen2};
use super::rope::RopeTables;

/// What one forward pass left for [`gradients`].
struct Tape<B: Backend> {
    /// The model's embedding, to check that the tape is `gradients`' model's.
    model: ParamId,
    ids: Tensor<B, 2, Int>,
    /// The inputs of layers 1.. (layer 0's is recomputed from `ids`), untracked.
    inputs: Vec<Tensor<B, 3>>,
    /// The last layer's output as a leaf: the rest of the forward pass is tracked from it.
    leaf: Tensor<B, 3>,
    rope: RopeTables<B>,
    mask: AttnMask<B>,
}

thread_local! {
    static TAPES: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// The decoder layers over `x` (the embedding's output, tracked) without keeping their
/// activations: their output as a new leaf, the inputs taped for [`gradients`].
pub(crate) fn forward<B: Backend>(model: &Qwen2<B>, ids: &Tensor<B, 2, Int>, x: Tensor<B, 3>, rope: &RopeTables<B>, mask: &AttnMask<B>) -> Tensor<B, 3> {
    let mut x = x.detach();
    let mut inputs = Vec::with_capacity(model.layers.len().saturating_sub(1));
    for (i, layer) in model.layers.iter().enumerate() {
        if i > 0 {
            inputs.push(x.clone());
        }
        x = layer.clone().no_grad().forward(x, rope, mask, None);
    }
    let leaf = x.detach().require_grad();
    let tape = Tape { model: model.embed_tokens.weight.id, ids: ids.clone(), inputs, leaf: leaf.clone(), rope: rope.clone(), mask: mask.clone() };
    TAPES.with(|t| t.borrow_mut().push(Box::new(tape)));
    leaf
}

/// Drops this thread's tapes (the training loop starts clean: a forward pass whose loss never
/// reached [`gradients`], after an error, leaves its tape).
pub fn clear() {
    TAPES.with(|t| t.borrow_mut().clear());
}

/// The forward passes taped on this thread that [`gradients`] has not consumed yet.
pub fn taped() -> usize {
    TAPES.with(|t| t.borrow().len())
}

/// `loss.backward()` as the parameters' gradients, through the checkpointed layers of every
/// forward pass of `model` since the last call on this thread (without checkpointing, exactly
/// `GradientsParams::from_grads(loss.backward(), model)`). A taped pass the loss does not
/// depend on is dropped.
pub fn gradients<B: AutodiffBackend>(loss: Tensor<B, 1>, model: &Qwen2<B>) -> GradientsParams {
    let tapes: Vec<Box<dyn Any>> = TAPES.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let mut grads = loss.backward();
    let mut pending = Vec::new();
    for tape in tapes {
        let Ok(tape) = tape.downcast::<Tape<B>>() else { continue };
        assert_eq!(tape.model, model.embed_tokens.weight.id, "a forward pass of another model was taped on this thread");
        if let Some(g) = tape.leaf.grad_remove(&mut grads) {
            pending.push((tape, g));
        }
    }
    if pending.is_empty() {
        return GradientsParams::from_grads(grads, model);
    }
    let mut sum = GradientsAccumulator::<Qwen2<B>>::new();
    sum.accumulate(model, GradientsParams::from_grads(grads, model));
    for (tape, g) in pending {
        let Tape { ids, mut inputs, rope, mask, .. } = *tape;
        let mut g = Tensor::<B, 3>::from_inner(g);
        for layer in model.layers.iter().rev() {
            // Layer 0 recomputes the embedding too: its gradient reaches the embedding's weight.
            let x = match inputs.pop() {
                Some(input) => input.require_grad(),
                None => model.embed(ids.clone()),
            };
            let y = layer.forward(x.clone(), &rope, &mask, None);
            let mut grads = (y * g).backward();
            let dx = x.grad_remove(&mut grads);
            sum.accumulate(model, GradientsParams::from_grads(grads, model));
            match dx {
                Some(dx) => g = Tensor::from_inner(dx),
                None => break,
            }
        }
    }
    sum.grads()
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::module::Module;
    use burn::tensor::Tensor;
    use burn_flex::Flex;

    use super::gradients;
    use crate::model::{Dtype, HostBatch, Qwen2, Qwen2Config};

    fn config() -> Qwen2Config {
        serde_json::from_str(
            r#"{"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}"#,
        )
        .unwrap()
    }

    /// One loss's gradients, every parameter's values in name order.
    fn grads<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device, dtype: Option<Dtype>) -> (usize, Vec<Vec<f32>>) {
        crate::model::custom_op::install::<B>();
        let mut model = Qwen2::<B>::random(&config(), 7, device).unwrap();
        if let Some(dtype) = dtype {
            model = model.with_compute_dtype(dtype);
        }
        // Two rows, one right-padded.
        let rows: Vec<Vec<u32>> = [24, 17].iter().map(|&n| (0..n).map(|i| (i * 37 % 97) as u32).collect()).collect();
        let inputs = HostBatch::right_padded(&rows, 0).unwrap().to_device::<B>(device);
        let taped = super::taped();
        let loss = model.forward(&inputs).cast(burn::tensor::DType::F32).powi_scalar(2).mean();
        let tapes = super::taped() - taped;
        let mut grads = gradients(loss, &model);
        let mut out = Vec::new();
        model.visit(&mut Collect(&mut grads, &mut out));
        (tapes, out)
    }

    struct Collect<'a>(&'a mut burn::optim::GradientsParams, &'a mut Vec<Vec<f32>>);

    impl<B: burn::tensor::backend::AutodiffBackend> burn::module::ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            let g = self.0.remove::<B::InnerBackend, D>(param.id).expect("every parameter has a gradient");
            self.1.push(g.cast(burn::tensor::DType::F32).into_data().to_vec::<f32>().unwrap());
        }
    }

    /// Checkpointed layers give the same gradients, bit for bit, as the whole graph kept, in f32
    /// and with bf16 activations (bf16 products on a CPU with AVX512-BF16).
    #[test]
    fn checkpointed_gradients_equal_the_whole_graphs() {
        compare::<Flex>(&Default::default(), Dtype::BF16);
    }

    /// The same on wgpu (kiln's CubeCL kernels), half precision in f16 (WGSL has no bf16).
    #[cfg(feature = "wgpu")]
    #[test]
    fn checkpointed_gradients_equal_the_whole_graphs_on_wgpu() {
        compare::<burn::backend::Wgpu>(&crate::model::cube::tests::wgpu::device(), Dtype::F16);
    }

    fn compare<I: burn::tensor::backend::Backend>(device: &I::Device, half: Dtype) {
        for dtype in [None, Some(half)] {
            let (tapes, whole) = grads::<Autodiff<I>>(device, dtype);
            assert_eq!(tapes, 0, "no tape without checkpointing");
            let (tapes, checkpointed) = grads::<Autodiff<I, BalancedCheckpointing>>(device, dtype);
            assert_eq!(tapes, 1, "the forward pass tapes its layers");
            assert_eq!(whole.len(), checkpointed.len());
            assert!(whole.iter().all(|g| g.iter().any(|v| *v != 0.0)), "every gradient is nonzero");
            for (i, (a, b)) in whole.iter().zip(&checkpointed).enumerate() {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{dtype:?}: parameter {i} differs");
            }
        }
    }
}
