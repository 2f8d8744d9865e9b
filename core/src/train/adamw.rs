//! AdamW with Hugging Face Trainer's parameter groups and global-norm gradient clipping,
//! following `torch.optim.AdamW` (single-tensor path) operation by operation.
//!
//! State is keyed by the parameter's Hugging Face name, so it survives a reload of the model
//! (new burn parameter ids) and is saved next to the HF checkpoint.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Int, Tensor, backend::AutodiffBackend, backend::Backend};
use burn::tensor::ElementConversion;
use serde::{Deserialize, Serialize};

use crate::dist::OptimizerShard;
use crate::model::proj::to_dtype;

#[cfg(doc)]
use crate::model::Qwen2;

/// AdamW's settings: a run config's `[optimizer]` section is read straight into this (its
/// defaults: [`crate::train::config::defaults`]). `Default` is HF Trainer's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// The peak learning rate; the run's `[schedule]` scales it step by step. (Checkpoints
    /// written before it was recorded here read as 0.)
    #[serde(default)]
    pub lr: f64,
    pub weight_decay: f64,
    /// Clip the global L2 norm of all gradients to this value (`None` or ≤ 0: no clipping).
    pub max_grad_norm: Option<f64>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { lr: 5e-5, weight_decay: 0.0, max_grad_norm: Some(1.0), beta1: 0.9, beta2: 0.999, eps: 1e-8 }
    }
}

impl AdamWConfig {
    /// HF Trainer's settings at learning rate `lr`.
    pub fn with_lr(lr: f64) -> Self {
        Self { lr, ..Self::default() }
    }

    /// `torch.optim.AdamW`'s checks (0 ≤ lr, eps, weight_decay; 0 ≤ beta1, beta2 < 1), finite
    /// values, and a clipping norm that is a number: the key at fault and why. A beta of 1 would
    /// divide by zero in the bias correction, a NaN turn every weight NaN.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        let at_least_0 = [("lr", self.lr), ("eps", self.eps), ("weight_decay", self.weight_decay)];
        if let Some((key, value)) = at_least_0.into_iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
            return Err((key, format!("[optimizer] {key} must be a finite number >= 0 (got {value})")));
        }
        if let Some((key, value)) = [("beta1", self.beta1), ("beta2", self.beta2)].into_iter().find(|(_, v)| !(0.0..1.0).contains(v)) {
            return Err((key, format!("[optimizer] {key} must be in [0, 1) (got {value})")));
        }
        if let Some(norm) = self.max_grad_norm.filter(|n| n.is_nan()) {
            return Err(("max_grad_norm", format!("[optimizer] max_grad_norm must be a number (got {norm}; 0 or less: no clipping)")));
        }
        Ok(())
    }
}

/// HF Trainer's rule: no weight decay for parameters whose name contains "bias", "layernorm"
/// or "rmsnorm" (so Qwen2's final `model.norm.weight` and the embedding *are* decayed).
pub fn decays(name: &str) -> bool {
    let lower = name.to_lowercase();
    !["bias", "layernorm", "rmsnorm"].iter().any(|k| lower.contains(k))
}

/// First and second moments of one parameter, flattened.
#[derive(Debug, Clone)]
pub struct Moments<B: Backend> {
    pub exp_avg: Tensor<B, 1>,
    pub exp_avg_sq: Tensor<B, 1>,
}

/// The optimizer: config, update count and per-parameter moments (on the inner backend).
#[derive(Debug, Clone)]
pub struct AdamW<B: Backend> {
    pub config: AdamWConfig,
    /// Updates taken so far (torch's `step`, used for bias correction).
    pub step: u64,
    pub moments: HashMap<String, Moments<B>>,
    /// Of the last update, over the half-precision parameters (bf16-pure training): how many
    /// weights it changed, of how many (a weight stays when its step rounds away).
    pub changed: Option<(u64, u64)>,
    /// ZeRO-1: the values this replica updates and keeps moments for; the others are left as
    /// they are (their owners' new values are gathered after the update). `None`: all.
    pub shard: Option<OptimizerShard>,
}

impl<B: Backend> AdamW<B> {
    pub fn new(config: AdamWConfig) -> Self {
        Self { config, step: 0, moments: HashMap::new(), changed: None, shard: None }
    }

    /// With a [`AdamW::shard`], cuts whole moments (as loaded or gathered for a checkpoint) down
    /// to this replica's values.
    pub fn keep_own_moments(&mut self) {
        if let Some(shard) = &self.shard {
            shard.drop_others(&mut self.moments);
        }
    }

    /// Clips `grads` by global norm, applies one update at learning rate `lr` to every
    /// parameter that has a gradient, and returns the model and the pre-clipping gradient norm.
    /// `names` gives each parameter's stable name (see [`Qwen2::param_names`]).
    ///
    /// A non-finite gradient norm (a NaN or infinite loss or gradient) skips the update, as verl
    /// does: the model and the optimizer's moments and step count are left as they were, and the
    /// returned norm tells the caller.
    ///
    /// This reads the norm back synchronously; where that cannot be done (WebGPU in the
    /// browser), read [`squared_grad_norm`] asynchronously and call [`AdamW::apply`].
    pub fn update<AB, M>(&mut self, model: M, names: &HashMap<ParamId, String>, grads: GradientsParams, lr: f64) -> (M, f64)
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        let grad_norm = read_norm(&model, &grads);
        (self.step_with(model, names, grads, lr, grad_norm, 1.0), grad_norm)
    }

    /// [`AdamW::update`] with gradients of a loss multiplied by `loss_scale` (f16 loss scaling):
    /// they are divided by it (the norm returned is the unscaled one), and when their norm is
    /// not finite nothing is updated (the model comes back unchanged, the step count stays).
    pub fn update_scaled<AB, M>(&mut self, model: M, names: &HashMap<ParamId, String>, grads: GradientsParams, lr: f64, loss_scale: f64) -> (M, f64)
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        let unscale = 1.0 / loss_scale;
        let grad_norm = read_norm(&model, &grads) * unscale;
        (self.step_with(model, names, grads, lr, grad_norm, unscale), grad_norm)
    }

    /// [`AdamW::update`] given the global gradient norm (the square root of
    /// [`squared_grad_norm`]), read back by the caller: clips, steps, or skips the update when
    /// `grad_norm` is not finite.
    pub fn apply<AB, M>(&mut self, model: M, names: &HashMap<ParamId, String>, grads: GradientsParams, lr: f64, grad_norm: f64) -> M
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        self.step_with(model, names, grads, lr, grad_norm, 1.0)
    }

    /// One update given the (unscaled) gradient norm, every gradient multiplied by `unscale`.
    fn step_with<AB, M>(&mut self, model: M, names: &HashMap<ParamId, String>, mut grads: GradientsParams, lr: f64, grad_norm: f64, unscale: f64) -> M
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        self.changed = None;
        if !grad_norm.is_finite() {
            return model;
        }
        let clip = match self.config.max_grad_norm {
            // torch.nn.utils.clip_grad_norm_: coefficient clamped at 1, always applied.
            Some(max) if max > 0.0 => Some((max / (grad_norm + 1e-6)).min(1.0)),
            _ => None,
        };
        let scale = if unscale == 1.0 { clip } else { Some(clip.unwrap_or(1.0) * unscale) };
        self.step += 1;
        let mut mapper = Updater { optimizer: self, grads: &mut grads, names, lr, clip: scale, changed: None };
        let model = model.map(&mut mapper);
        // Only half-precision parameters count (bf16-pure training); never in f32 or the browser.
        let changed = mapper.changed.map(|(n, total)| (n.into_scalar().elem::<f64>() as u64, total));
        self.changed = changed;
        model
    }
}

/// The global gradient norm, read back synchronously.
fn read_norm<AB: AutodiffBackend, M: AutodiffModule<AB>>(model: &M, grads: &GradientsParams) -> f64 {
    squared_grad_norm(model, grads).map_or(0.0, |t| t.into_scalar().elem::<f64>()).sqrt()
}

/// Σ ‖g‖² over the gradients `grads` of `model`'s parameters, on the device (`None` when no
/// parameter has a gradient): the square of the norm [`AdamW::update`] clips by.
pub fn squared_grad_norm<AB, M>(model: &M, grads: &GradientsParams) -> Option<Tensor<AB::InnerBackend, 1>>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let mut norm = SquaredNorm::<AB::InnerBackend> { grads, total: None };
    model.visit(&mut norm);
    norm.total
}

/// Σ ‖g‖² over all gradients of a model.
struct SquaredNorm<'a, B: Backend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<B, 1>>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for SquaredNorm<'_, AB::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if let Some(grad) = self.grads.get::<AB::InnerBackend, D>(param.id) {
            // In f32 whatever the gradient's dtype (torch's norms accumulate in f32 too).
            let sq = to_dtype(grad, DType::F32).square().sum();
            self.total = Some(match self.total.take() {
                Some(total) => total + sq,
                None => sq,
            });
        }
    }
}

struct Updater<'a, B: Backend> {
    optimizer: &'a mut AdamW<B>,
    grads: &'a mut GradientsParams,
    names: &'a HashMap<ParamId, String>,
    lr: f64,
    /// Factor applied to every gradient (clipping and loss unscaling).
    clip: Option<f64>,
    /// Weights changed and considered, over half-precision parameters.
    changed: Option<(Tensor<B, 1, Int>, u64)>,
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for Updater<'_, AB::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<AB::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let name = self.names.get(&id).cloned().unwrap_or_else(|| format!("param-{id}"));
        let dims = tensor.dims();
        let numel = dims.iter().product::<usize>();
        // ZeRO-1: only this replica's values of the parameter (see `dist::OptimizerShard`).
        let range = self.optimizer.shard.as_ref().map_or(0..numel, |shard| shard.range(&name, numel));
        if range.is_empty() {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let whole = range.len() == numel;
        let old = tensor.inner().reshape([numel]);
        let (old_part, grad) = match whole {
            true => (old.clone(), grad.reshape([numel])),
            false => (old.clone().slice(range.clone()), grad.reshape([numel]).slice(range.clone())),
        };
        let part = self.optimizer.update_one(&name, old_part.clone(), grad, self.lr, self.clip);
        if part.dtype() != DType::F32 {
            let n = part.clone().not_equal(old_part).int().sum();
            self.changed = Some(match self.changed.take() {
                Some((total, count)) => (total + n, count + range.len() as u64),
                None => (n, range.len() as u64),
            });
        }
        let updated = if whole { part } else { old.slice_assign(range, part) };
        let tensor = Tensor::from_inner(updated.reshape(dims)).require_grad();
        Param::from_mapped_value(id, tensor, mapper)
    }
}

impl<B: Backend> AdamW<B> {
    /// One torch AdamW update of parameter `name` (flattened `param` and `grad`, the gradient
    /// scaled by `clip` first).
    fn update_one(&mut self, name: &str, param: Tensor<B, 1>, grad: Tensor<B, 1>, lr: f64, clip: Option<f64>) -> Tensor<B, 1> {
        let c = self.config;
        {
            let t = (self.step as i32).max(1);
            let step = crate::model::kernels::AdamWStep {
                clip: clip.map(|c| c as f32),
                decay: (decays(name) && c.weight_decay != 0.0).then_some((1.0 - lr * c.weight_decay) as f32),
                w: (1.0 - c.beta1) as f32,
                beta2: c.beta2 as f32,
                one_minus_beta2: (1.0 - c.beta2) as f32,
                bias_correction2_sqrt: (1.0 - c.beta2.powi(t)).sqrt() as f32,
                eps: c.eps as f32,
                step_size: (lr / (1.0 - c.beta1.powi(t))) as f32,
            };
            let moments = self.moments.remove(name).map(|m| (m.exp_avg, m.exp_avg_sq));
            if let Some((param, exp_avg, exp_avg_sq)) = (crate::model::kernels::kernels::<B>().adamw)(param.clone(), grad.clone(), moments.clone(), step) {
                self.moments.insert(name.to_string(), Moments { exp_avg, exp_avg_sq });
                return param;
            }
            if let Some((exp_avg, exp_avg_sq)) = moments {
                self.moments.insert(name.to_string(), Moments { exp_avg, exp_avg_sq });
            }
        }
        let grad = match clip {
            Some(coefficient) => grad.mul_scalar(coefficient),
            None => grad,
        };
        let param = if decays(name) && c.weight_decay != 0.0 { param.mul_scalar(1.0 - lr * c.weight_decay) } else { param };
        let moments = match self.moments.remove(name) {
            // The state's dtype is the parameter's (f32 checkpoints of bf16 state load as f32).
            Some(m) => Moments { exp_avg: to_dtype(m.exp_avg, grad.dtype()), exp_avg_sq: to_dtype(m.exp_avg_sq, grad.dtype()) },
            None => Moments { exp_avg: grad.zeros_like(), exp_avg_sq: grad.zeros_like() },
        };
        // exp_avg.lerp_(grad, 1 - β1): m + w·(g − m) for w < 0.5.
        let w = 1.0 - c.beta1;
        let exp_avg = moments.exp_avg.clone() + (grad.clone() - moments.exp_avg).mul_scalar(w);
        // exp_avg_sq.mul_(β2).addcmul_(grad, grad, value = 1 − β2)
        let exp_avg_sq = moments.exp_avg_sq.mul_scalar(c.beta2) + grad.clone().mul_scalar(1.0 - c.beta2) * grad;
        let t = self.step as i32;
        let step_size = lr / (1.0 - c.beta1.powi(t));
        let bias_correction2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        let denom = exp_avg_sq.clone().sqrt().div_scalar(bias_correction2_sqrt).add_scalar(c.eps);
        let param = param - (exp_avg.clone() / denom).mul_scalar(step_size);
        self.moments.insert(name.to_string(), Moments { exp_avg, exp_avg_sq });
        param
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::tensor::TensorData;
    use serde_json::Value;

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Params<B: Backend> {
        weight: Param<Tensor<B, 2>>,
        bias: Param<Tensor<B, 1>>,
        input_layernorm: Param<Tensor<B, 1>>,
        norm: Param<Tensor<B, 1>>,
    }

    fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    /// `torch.optim.AdamW` with HF parameter groups and `clip_grad_norm_`, five steps.
    #[test]
    fn matches_torch_adamw_with_hf_groups_and_clipping() {
        matches_torch_adamw::<B>(&Default::default());
    }

    /// The same on wgpu, where the update is kiln's CubeCL kernel (`model::cube`).
    #[cfg(feature = "wgpu")]
    #[test]
    fn matches_torch_adamw_on_wgpu() {
        type Wgpu = burn::backend::Wgpu;
        let device = crate::model::cube::tests::wgpu::device();
        assert_eq!(crate::model::kernels::kernels::<Wgpu>().name, "cubecl");
        matches_torch_adamw::<Autodiff<Wgpu>>(&device);
    }

    fn matches_torch_adamw<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/optim/adamw.json");
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let names = [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.q_proj.bias",
            "model.layers.0.input_layernorm.weight",
            "model.norm.weight",
        ];
        assert_eq!(names.iter().filter(|n| !decays(n)).count(), fixture["no_decay"].as_array().unwrap().len());
        let device = device.clone();
        let vector = |name: &str| Param::from_data(TensorData::new(floats(&fixture["initial"][name]), [3]), &device);
        let mut model = Params::<B> {
            weight: Param::from_data(TensorData::new(floats(&fixture["initial"][names[0]]), [4, 3]), &device),
            bias: Param::from_data(TensorData::new(floats(&fixture["initial"][names[1]]), [4]), &device),
            input_layernorm: vector(names[2]),
            norm: vector(names[3]),
        };
        let ids = [model.weight.id, model.bias.id, model.input_layernorm.id, model.norm.id];
        let by_id: HashMap<ParamId, String> = ids.iter().zip(names).map(|(id, n)| (*id, n.to_string())).collect();
        let config = AdamWConfig {
            beta2: 0.95,
            weight_decay: fixture["weight_decay"].as_f64().unwrap(),
            ..AdamWConfig::default()
        };
        let mut optimizer = AdamW::<B::InnerBackend>::new(config);
        for (k, step) in fixture["steps"].as_array().unwrap().iter().enumerate() {
            // loss = Σ p·G, so dL/dp = G exactly.
            let g = |name: &str, dims: Vec<usize>| Tensor::<B, 1>::from_data(TensorData::new(floats(&step["grads"][name]), [dims.iter().product::<usize>()]), &device);
            let loss = (model.weight.val().reshape([12]) * g(names[0], vec![4, 3])).sum()
                + (model.bias.val() * g(names[1], vec![4])).sum()
                + (model.input_layernorm.val() * g(names[2], vec![3])).sum()
                + (model.norm.val() * g(names[3], vec![3])).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let (next, norm) = optimizer.update(model, &by_id, grads, step["lr"].as_f64().unwrap());
            model = next;
            let expected_norm = step["grad_norm"].as_f64().unwrap();
            assert!((norm - expected_norm).abs() <= 1e-6 * expected_norm, "step {k}: norm {norm} vs {expected_norm}");
            let ours = [
                model.weight.val().into_data().to_vec::<f32>().unwrap(),
                model.bias.val().into_data().to_vec::<f32>().unwrap(),
                model.input_layernorm.val().into_data().to_vec::<f32>().unwrap(),
                model.norm.val().into_data().to_vec::<f32>().unwrap(),
            ];
            for (name, values) in names.iter().zip(ours) {
                for (a, b) in values.iter().zip(floats(&step["params"][*name])) {
                    assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-2), "step {k} {name}: {a} vs {b}");
                }
            }
        }
    }
}
