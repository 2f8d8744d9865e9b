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
//! `kiln_backends::run_training_with` picks for `recompute`), or [`Split`] below: a trainable
//! model then tapes its forward passes, which only [`gradients`] turns into gradients
//! (`loss.backward()` alone would give the layers none).
//!
//! Without recomputation the backward pass can go layer by layer too ([`Split`]: the
//! forward pass keeps each layer's graph, cut at its input, and nothing is recomputed), so that
//! [`gradients_with`] hands out each layer's gradients as soon as they are made: data-parallel
//! training all-reduces them while the layers below are still differentiated
//! ([`crate::dist::Overlap`]). The gradients are the same bits either way.

use std::any::Any;
use std::cell::{Cell, RefCell};

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
    /// With recomputation: the inputs of layers 1.. (layer 0's is recomputed from `ids`),
    /// untracked.
    inputs: Vec<Tensor<B, 3>>,
    /// Under [`Split`]: every layer's input (layer 0's the embedding's tracked output, leaves
    /// above) and its output with the layer's graph; nothing is recomputed.
    kept: Vec<(Tensor<B, 3>, Tensor<B, 3>)>,
    /// The last layer's output as a leaf: the rest of the forward pass is tracked from it.
    leaf: Tensor<B, 3>,
    rope: RopeTables<B>,
    mask: AttnMask<B>,
}

thread_local! {
    static TAPES: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
    static SPLIT: Cell<bool> = const { Cell::new(false) };
}

/// While held (and made `on`), this thread's training forward passes keep each layer's graph
/// apart, without recomputation, for a backward pass that hands out the layers' gradients as
/// they are made ([`gradients_with`]). The training loop holds one for the micro-batch whose
/// gradients it all-reduces while differentiating; dropped (after the backward pass, or an
/// error), it turns the mode off and drops any tape left.
pub struct Split(());

impl Split {
    /// Splits this thread's forward passes by layer if `on`.
    pub fn on(on: bool) -> Self {
        SPLIT.with(|s| s.set(on));
        Split(())
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        SPLIT.with(|s| s.set(false));
        clear();
    }
}

/// Whether a training forward pass on this thread goes through [`forward`]: under burn's
/// `BalancedCheckpointing` (`recompute`), or a [`Split`].
pub(crate) fn taping(recompute: bool) -> bool {
    recompute || SPLIT.with(Cell::get)
}

/// The decoder layers over `x` (the embedding's output, tracked): their output as a new leaf,
/// what [`gradients`] needs taped. With `recompute`, without keeping their activations (the
/// inputs taped); else each layer's graph, cut at its input.
pub(crate) fn forward<B: Backend>(model: &Qwen2<B>, ids: &Tensor<B, 2, Int>, x: Tensor<B, 3>, rope: &RopeTables<B>, mask: &AttnMask<B>, recompute: bool) -> Tensor<B, 3> {
    let (mut inputs, mut kept) = (Vec::new(), Vec::new());
    let mut x = if recompute { x.detach() } else { x };
    for (i, layer) in model.layers.iter().enumerate() {
        if recompute {
            if i > 0 {
                inputs.push(x.clone());
            }
            x = layer.clone().no_grad().forward(x, rope, mask, None);
        } else {
            let input = if i > 0 { x.detach().require_grad() } else { x };
            x = layer.forward(input.clone(), rope, mask, None);
            kept.push((input, x.clone()));
        }
    }
    let leaf = x.detach().require_grad();
    let tape = Tape { model: model.embed_tokens.weight.id, ids: ids.clone(), inputs, kept, leaf: leaf.clone(), rope: rope.clone(), mask: mask.clone() };
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

/// `loss.backward()` as the parameters' gradients, through the checkpointed (or split) layers of
/// every forward pass of `model` since the last call on this thread (with no tape, exactly
/// `GradientsParams::from_grads(loss.backward(), model)`). A taped pass the loss does not
/// depend on is dropped.
pub fn gradients<B: AutodiffBackend>(loss: Tensor<B, 1>, model: &Qwen2<B>) -> GradientsParams {
    gradients_with(loss, model, |_, _| {})
}

/// [`gradients`], calling `layer_done(i, grads)` as soon as decoder layer `i`'s parameters have
/// their gradients (`grads`: those of layer `i`'s backward pass, which are its parameters' whole
/// gradients), last layer first. Called only when the loss comes from one taped forward pass
/// and reaches no layer's parameters outside it (else a layer's gradient is complete only at
/// the end).
pub fn gradients_with<B: AutodiffBackend>(loss: Tensor<B, 1>, model: &Qwen2<B>, mut layer_done: impl FnMut(usize, &GradientsParams)) -> GradientsParams {
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
    let rest = GradientsParams::from_grads(grads, model);
    let single = pending.len() == 1 && !model.layers.iter().any(|layer| has_any(layer, &rest));
    let mut sum = GradientsAccumulator::<Qwen2<B>>::new();
    sum.accumulate(model, rest);
    for (tape, g) in pending {
        let Tape { ids, mut inputs, mut kept, rope, mask, .. } = *tape;
        let mut g = Tensor::<B, 3>::from_inner(g);
        for (i, layer) in model.layers.iter().enumerate().rev() {
            let (x, y) = match kept.pop() {
                Some(graph) => graph,
                None => {
                    // Layer 0 recomputes the embedding too: its gradient reaches the embedding's
                    // weight.
                    let x = match inputs.pop() {
                        Some(input) => input.require_grad(),
                        None => model.embed(ids.clone()),
                    };
                    (x.clone(), layer.forward(x, &rope, &mask, None))
                }
            };
            let mut grads = (y * g).backward();
            let dx = x.grad_remove(&mut grads);
            let grads = GradientsParams::from_grads(grads, model);
            if single {
                layer_done(i, &grads);
            }
            sum.accumulate(model, grads);
            match dx {
                Some(dx) => g = Tensor::from_inner(dx),
                None => break,
            }
        }
    }
    sum.grads()
}

/// Whether `grads` holds a gradient of one of `module`'s parameters.
fn has_any<B: AutodiffBackend, M: Module<B>>(module: &M, grads: &GradientsParams) -> bool {
    struct Any<'a>(&'a GradientsParams, bool);
    impl<B: AutodiffBackend> burn::module::ModuleVisitor<B> for Any<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            self.1 |= self.0.get::<B::InnerBackend, D>(param.id).is_some();
        }
    }
    let mut any = Any(grads, false);
    module.visit(&mut any);
    any.1
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::module::Module;
    use burn::tensor::Tensor;
    use burn_flex::Flex;

    use crate::model::{Dtype, HostBatch, Qwen2, Qwen2Config};

    fn config() -> Qwen2Config {
        serde_json::from_str(
            r#"{"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}"#,
        )
        .unwrap()
    }

    /// One loss's gradients, every parameter's values in visiting order.
    fn grads<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device, dtype: Option<Dtype>) -> (usize, Vec<Vec<f32>>) {
        let (tapes, out, _) = grads_split::<B>(device, dtype, false);
        (tapes, out)
    }

    /// [`grads`], the layers split apart (`split`: [`super::Split`]); also what
    /// `gradients_with` handed out: each layer's index and its parameters' gradients.
    #[allow(clippy::type_complexity)]
    fn grads_split<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device, dtype: Option<Dtype>, split: bool) -> (usize, Vec<Vec<f32>>, Vec<(usize, Vec<Vec<f32>>)>) {
        crate::model::custom_op::install::<B>();
        let mut model = Qwen2::<B>::random(&config(), 7, device).unwrap();
        if let Some(dtype) = dtype {
            model = model.with_compute_dtype(dtype);
        }
        // Two rows, one right-padded.
        let rows: Vec<Vec<u32>> = [24, 17].iter().map(|&n| (0..n).map(|i| (i * 37 % 97) as u32).collect()).collect();
        let inputs = HostBatch::right_padded(&rows, 0).unwrap().to_device::<B>(device);
        let taped = super::taped();
        let splitting = super::Split::on(split);
        let loss = model.forward(&inputs).cast(burn::tensor::DType::F32).powi_scalar(2).mean();
        let tapes = super::taped() - taped;
        let mut handed = Vec::new();
        let grads = super::gradients_with(loss, &model, |i, grads| {
            let mut out = Vec::new();
            model.layers[i].visit(&mut Collect(grads, &mut out));
            handed.push((i, out));
        });
        drop(splitting);
        let mut out = Vec::new();
        model.visit(&mut Collect(&grads, &mut out));
        (tapes, out, handed)
    }

    struct Collect<'a>(&'a burn::optim::GradientsParams, &'a mut Vec<Vec<f32>>);

    impl<B: burn::tensor::backend::AutodiffBackend> burn::module::ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            let g = self.0.get::<B::InnerBackend, D>(param.id).expect("every parameter has a gradient");
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
            // Split by layer, nothing recomputed (the overlapped all-reduce's backward pass): the
            // same bits, and each layer's gradients handed out whole, last layer first.
            let (tapes, split, handed) = grads_split::<Autodiff<I>>(device, dtype, true);
            assert_eq!(tapes, 1, "the split forward pass tapes its layers");
            assert!(whole.iter().zip(&split).all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())), "{dtype:?}: split gradients differ");
            assert_eq!(handed.iter().map(|h| h.0).collect::<Vec<_>>(), [2, 1, 0]);
            for (i, layer) in &handed {
                // The layers' parameters follow the embedding's in visiting order.
                let start = 1 + i * layer.len();
                assert_eq!(layer, &split[start..start + layer.len()], "layer {i}: the gradients handed out are not the final ones");
            }
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
