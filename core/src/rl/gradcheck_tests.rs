//! Finite-difference check of the policy-gradient loss's gradient through a tiny Qwen2, in f64
//! (burn's ndarray backend, used by no other test: burn fixes a device's float dtype at its first
//! use in a process, so the crate's f32 tests run on Flex): for a random direction `v` over all parameters, the derivative of
//! `L(θ + hv)` at 0 from central differences must equal `∇L · v`. The loss covers the clipped
//! surrogate (tokens inside and outside the clip range, dual clip), the k3 KL term, every
//! aggregation mode and the full-vocabulary reverse KL.
//!
//! The model is f64 except where it follows `transformers` into f32 (RMSNorm normalises in f32),
//! which leaves rounding noise of about 1e-10 in L. Differences at h = 1e-3 and 5e-4 combined by
//! Richardson extrapolation keep both truncation error and that noise near 1e-7 relative
//! (measured: ≤ 1e-6); the tolerance is 1e-5, far below what a wrong gradient gives.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::batch::{ResponseBatch, ResponseLayout, response_logits};
use super::loss::{Clip, KlEstimator, LossAgg, aggregate, kl_penalty, policy_loss, reverse_kl};
use crate::model::{Qwen2, Qwen2Config};

type B = Autodiff<NdArray<f64>>;

fn config(vocab: usize) -> Qwen2Config {
    serde_json::from_str(&format!(
        r#"{{"vocab_size": {vocab}, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
            "max_position_embeddings": 32, "rope_theta": 10000.0, "eos_token_id": 3}}"#
    ))
    .unwrap()
}

/// Adds `scale · v` to every parameter, `v` drawn from a fixed stream in visiting order.
struct Shift {
    rng: ChaCha8Rng,
    scale: f64,
}

impl<AB: Backend> ModuleMapper<AB> for Shift {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        let v: Vec<f64> = (0..dims.iter().product::<usize>()).map(|_| self.rng.random_range(-1.0..1.0)).collect();
        let shift = Tensor::<AB, D>::from_data(TensorData::new(v, dims), &tensor.device());
        Param::from_mapped_value(id, tensor + shift * self.scale, mapper)
    }
}

/// `∇L · v` with the same `v` as [`Shift`].
struct Dot<'a> {
    rng: ChaCha8Rng,
    grads: &'a <B as AutodiffBackend>::Gradients,
    total: f64,
}

impl ModuleVisitor<B> for Dot<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let dims = param.val().dims();
        let v: Vec<f64> = (0..dims.iter().product::<usize>()).map(|_| self.rng.random_range(-1.0..1.0)).collect();
        if let Some(grad) = param.val().grad(self.grads) {
            let v = Tensor::<NdArray<f64>, D>::from_data(TensorData::new(v, dims), &grad.device());
            self.total += (grad * v).sum().into_scalar().elem::<f64>();
        }
    }
}

fn shifted(model: &Qwen2<B>, scale: f64) -> Qwen2<B> {
    model.clone().map(&mut Shift { rng: ChaCha8Rng::seed_from_u64(9), scale })
}

/// Log-probs of the response tokens in f64 (the library's `token_logprobs` computes in f32).
fn logprobs(model: &Qwen2<B>, batch: &ResponseBatch<B>) -> Tensor<B, 2> {
    log_softmax(response_logits(model, batch), 2).gather(2, batch.targets.clone().unsqueeze_dim(2)).squeeze_dim(2)
}

fn check(loss: impl Fn(&Qwen2<B>) -> Tensor<B, 1>, model: &Qwen2<B>, what: &str) {
    let grads = loss(model).backward();
    let mut dot = Dot { rng: ChaCha8Rng::seed_from_u64(9), grads: &grads, total: 0.0 };
    model.visit(&mut dot);
    let value = |m: &Qwen2<B>| loss(m).into_scalar().elem::<f64>();
    let central = |h: f64| (value(&shifted(model, h)) - value(&shifted(model, -h))) / (2.0 * h);
    // Richardson extrapolation of central differences at h and h/2 (error O(h⁴)).
    let numeric = (4.0 * central(5e-4) - central(1e-3)) / 3.0;
    let error = (numeric - dot.total).abs() / dot.total.abs().max(1e-3);
    assert!(error < 1e-5, "{what}: finite differences {numeric:.10} vs autodiff {:.10} (relative error {error:.2e})", dot.total);
}

#[test]
fn policy_gradient_loss_matches_finite_differences() {
    let device = Default::default();
    let model = Qwen2::<B>::random(&config(13), 5, &device).unwrap();
    let layout = ResponseLayout::new(&[(&[1, 2, 3], &[4, 5, 6, 7]), (&[2], &[8, 9]), (&[3, 4], &[10, 11, 12])], 0).unwrap();
    let batch = layout.to_device::<B>(&device);
    let current: Vec<f64> = logprobs(&model, &batch).into_data().convert::<f64>().into_vec().unwrap();
    // Old log-probs put ratios inside the clip range, above 1 + high, below 1 − low and beyond
    // the dual clip; the reference differs by a few tenths.
    let offsets = [0.01, -0.5, 0.3, -1.5, 0.02, 0.4, 0.0, 0.0, -0.25, 0.6, 1.3, 0.0];
    let old: Vec<f64> = current.iter().zip(offsets).map(|(c, o)| c + o).collect();
    let reference: Vec<f64> = current.iter().enumerate().map(|(i, c)| c + 0.3 * ((i as f64) * 1.7).sin()).collect();
    let tensor = |v: Vec<f64>| Tensor::<B, 2>::from_data(TensorData::new(v, [3, 4]), &device);
    let (old, reference) = (tensor(old), tensor(reference));
    let sequence = tensor(vec![1.2, 1.2, 1.2, 1.2, -0.8, -0.8, -0.8, -0.8, -2.0, -2.0, -2.0, -2.0]);
    let per_token = tensor(vec![0.3, -1.1, 0.7, -0.2, 0.5, -0.9, 0.0, 0.0, -0.4, 1.6, -2.2, 0.0]);
    let clip = Clip { low: 0.2, high: 0.28, dual: 3.0 };
    for agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean, LossAgg::SeqMeanTokenSum, LossAgg::SeqMeanTokenSumNorm] {
        for (name, advantages) in [("GRPO", &sequence), ("OPD", &per_token)] {
            let loss = |m: &Qwen2<B>| {
                let log_prob = logprobs(m, &batch);
                let pg = policy_loss(log_prob.clone(), old.clone(), advantages.clone(), &batch.mask, clip, agg, 6);
                pg.loss + aggregate(kl_penalty(log_prob, reference.clone(), KlEstimator::K3), &batch.mask, agg, 6) * 0.1
            };
            check(loss, &model, &format!("{name} surrogate + k3, {agg:?}"));
        }
    }
    let teacher = Qwen2::<B>::random(&config(15), 6, &device).unwrap();
    // A sharper teacher makes the KL (and its gradient) large against the rounding noise.
    let teacher_logits = response_logits(&teacher, &batch).detach() * 30.0;
    let loss = |m: &Qwen2<B>| aggregate(reverse_kl(response_logits(m, &batch), teacher_logits.clone()), &batch.mask, LossAgg::TokenMean, 6);
    check(loss, &model, "full-vocabulary reverse KL");
}
