//! Building a [`Qwen2`] from named host tensors in Hugging Face layout, and exporting it back.
//!
//! HF names and shapes are the contract (`model.layers.{i}.self_attn.q_proj.weight` `[out, in]`
//! …). burn's `Linear` stores `[in, out]`, so linear weights are transposed on the way in and out.
//! Random initialisation is just another [`WeightSource`], so it follows the same path.

use std::collections::HashMap;

use burn::module::{Param, ParamId};
use burn::nn::{Embedding, Linear};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::config::Qwen2Config;
use super::cpu_decode;
use super::qwen2::{Attention, DecoderLayer, Mlp, Qwen2, RmsNorm};
use super::rope::RotaryEmbedding;
use crate::error::{Error, Result};

/// How a tensor is initialised and laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// `nn.Linear` weight, HF `[out, in]`.
    LinearWeight,
    /// `nn.Linear` bias.
    Bias,
    /// Embedding matrix `[vocab, hidden]`.
    Embedding,
    /// RMSNorm scale.
    Norm,
}

/// One tensor the model expects, in HF naming and layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

/// Every tensor of a `Qwen2ForCausalLM` checkpoint for `config`, in a fixed order.
pub fn expected_tensors(config: &Qwen2Config) -> Vec<TensorSpec> {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let q = config.num_attention_heads * config.head_dim();
    let kv = config.num_kv_heads() * config.head_dim();
    let spec = |name: String, shape: Vec<usize>, role| TensorSpec { name, shape, role };
    let mut out = vec![spec("model.embed_tokens.weight".into(), vec![config.vocab_size, h], TensorRole::Embedding)];
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}");
        use TensorRole::*;
        out.extend([
            spec(format!("{p}.input_layernorm.weight"), vec![h], Norm),
            spec(format!("{p}.self_attn.q_proj.weight"), vec![q, h], LinearWeight),
            spec(format!("{p}.self_attn.q_proj.bias"), vec![q], Bias),
            spec(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], LinearWeight),
            spec(format!("{p}.self_attn.k_proj.bias"), vec![kv], Bias),
            spec(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], LinearWeight),
            spec(format!("{p}.self_attn.v_proj.bias"), vec![kv], Bias),
            spec(format!("{p}.self_attn.o_proj.weight"), vec![h, q], LinearWeight),
            spec(format!("{p}.post_attention_layernorm.weight"), vec![h], Norm),
            spec(format!("{p}.mlp.gate_proj.weight"), vec![i, h], LinearWeight),
            spec(format!("{p}.mlp.up_proj.weight"), vec![i, h], LinearWeight),
            spec(format!("{p}.mlp.down_proj.weight"), vec![h, i], LinearWeight),
        ]);
    }
    out.push(spec("model.norm.weight".into(), vec![h], TensorRole::Norm));
    if !config.tie_word_embeddings {
        out.push(spec("lm_head.weight".into(), vec![config.vocab_size, h], TensorRole::LinearWeight));
    }
    out
}

/// Supplies host tensors (f32, HF layout, row-major) by name.
pub trait WeightSource {
    /// The tensor `spec.name`, which must have `spec.shape`.
    fn tensor(&mut self, spec: &TensorSpec) -> Result<Vec<f32>>;
}

/// Hugging Face's `_init_weights` for Qwen2: linear and embedding weights ~ N(0, σ), biases 0,
/// norm scales 1. Seeded, and drawn in [`expected_tensors`] order on the host, so the same seed
/// gives the same model on every backend.
pub struct RandomInit {
    rng: ChaCha8Rng,
    normal: Normal<f32>,
}

impl RandomInit {
    pub fn new(std: f64, seed: u64) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed), normal: Normal::new(0.0, std as f32).expect("finite std") }
    }
}

impl WeightSource for RandomInit {
    fn tensor(&mut self, spec: &TensorSpec) -> Result<Vec<f32>> {
        let len = spec.shape.iter().product();
        Ok(match spec.role {
            TensorRole::LinearWeight | TensorRole::Embedding => {
                (0..len).map(|_| self.normal.sample(&mut self.rng)).collect()
            }
            TensorRole::Bias => vec![0.0; len],
            TensorRole::Norm => vec![1.0; len],
        })
    }
}

impl<B: Backend> Qwen2<B> {
    /// Builds the model from `source` (a checkpoint or [`RandomInit`]).
    pub fn from_source(config: &Qwen2Config, source: &mut dyn WeightSource, device: &B::Device) -> Result<Self> {
        config.validate().map_err(|m| Error::InvalidInput(format!("invalid config: {m}")))?;
        let mut specs = expected_tensors(config).into_iter();
        let mut next = || -> Result<(TensorSpec, Vec<f32>)> {
            let spec = specs.next().expect("expected_tensors lists every parameter");
            let data = source.tensor(&spec)?;
            Ok((spec, data))
        };
        let embed_tokens = {
            let (spec, data) = next()?;
            Embedding { weight: Param::from_tensor(tensor(data, &spec.shape, device)) }
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for _ in 0..config.num_hidden_layers {
            let input_layernorm = norm(next()?, config, device);
            let q_proj = linear(next()?, Some(next()?), device);
            let k_proj = linear(next()?, Some(next()?), device);
            let v_proj = linear(next()?, Some(next()?), device);
            let o_proj = linear(next()?, None, device);
            let post_attention_layernorm = norm(next()?, config, device);
            let mlp = Mlp {
                gate_proj: linear(next()?, None, device),
                up_proj: linear(next()?, None, device),
                down_proj: linear(next()?, None, device),
            };
            let self_attn = Attention {
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_kv_heads(),
                head_dim: config.head_dim(),
            };
            layers.push(DecoderLayer { input_layernorm, self_attn, post_attention_layernorm, mlp });
        }
        let final_norm = norm(next()?, config, device);
        let lm_head = if config.tie_word_embeddings { None } else { Some(linear(next()?, None, device)) };
        let rope = RotaryEmbedding::new(config.head_dim(), config.rope_theta(), config.max_position_embeddings, device);
        Ok(Qwen2 { embed_tokens, layers, norm: final_norm, lm_head, rope, config: config.clone() })
    }

    /// A randomly initialised model (see [`RandomInit`]).
    pub fn random(config: &Qwen2Config, seed: u64, device: &B::Device) -> Result<Self> {
        Self::from_source(config, &mut RandomInit::new(config.initializer_range, seed), device)
    }

    /// Every parameter as `(spec, f32 data in HF layout)`, in [`expected_tensors`] order.
    pub fn to_hf_tensors(&self) -> Vec<(TensorSpec, Vec<f32>)> {
        let values = self.params().into_iter().map(|param| match param {
            ParamRef::Linear(p) => host(p.val().transpose()),
            ParamRef::Matrix(p) => host(p.val()),
            ParamRef::Vector(p) => host(p.val()),
        });
        expected_tensors(&self.config).into_iter().zip(values).collect()
    }

    /// The HF name of every parameter, by burn parameter id.
    pub fn param_names(&self) -> HashMap<ParamId, String> {
        let ids = self.params().into_iter().map(|param| match param {
            ParamRef::Linear(p) | ParamRef::Matrix(p) => p.id,
            ParamRef::Vector(p) => p.id,
        });
        ids.zip(expected_tensors(&self.config)).map(|(id, spec)| (id, spec.name)).collect()
    }

    /// Every parameter, in [`expected_tensors`] order.
    fn params(&self) -> Vec<ParamRef<'_, B>> {
        let mut out = vec![ParamRef::Matrix(&self.embed_tokens.weight)];
        for layer in &self.layers {
            let attn = &layer.self_attn;
            out.push(ParamRef::Vector(&layer.input_layernorm.weight));
            for proj in [&attn.q_proj, &attn.k_proj, &attn.v_proj] {
                out.push(ParamRef::Linear(&proj.weight));
                out.push(ParamRef::Vector(proj.bias.as_ref().expect("q/k/v have biases")));
            }
            out.push(ParamRef::Linear(&attn.o_proj.weight));
            out.push(ParamRef::Vector(&layer.post_attention_layernorm.weight));
            for proj in [&layer.mlp.gate_proj, &layer.mlp.up_proj, &layer.mlp.down_proj] {
                out.push(ParamRef::Linear(&proj.weight));
            }
        }
        out.push(ParamRef::Vector(&self.norm.weight));
        if let Some(head) = &self.lm_head {
            out.push(ParamRef::Linear(&head.weight));
        }
        out
    }
}

/// A parameter of the model, with how it maps to HF layout.
enum ParamRef<'a, B: Backend> {
    /// burn `[in, out]`, HF `[out, in]`.
    Linear(&'a Param<Tensor<B, 2>>),
    /// Same layout in both (the embedding).
    Matrix(&'a Param<Tensor<B, 2>>),
    Vector(&'a Param<Tensor<B, 1>>),
}

fn host<B: Backend, const N: usize>(t: Tensor<B, N>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().expect("f32 data")
}

fn tensor<B: Backend, const N: usize>(data: Vec<f32>, shape: &[usize], device: &B::Device) -> Tensor<B, N> {
    Tensor::from_data(TensorData::new(data, shape.to_vec()), device)
}

fn norm<B: Backend>((spec, data): (TensorSpec, Vec<f32>), config: &Qwen2Config, device: &B::Device) -> RmsNorm<B> {
    RmsNorm { weight: Param::from_tensor(tensor(data, &spec.shape, device)), eps: config.rms_norm_eps }
}

/// A burn `Linear` from an HF `[out, in]` weight, as burn's `[in, out]` (a transposed view where
/// the CPU decoding fast path wants HF's layout).
fn linear<B: Backend>(
    (spec, data): (TensorSpec, Vec<f32>),
    bias: Option<(TensorSpec, Vec<f32>)>,
    device: &B::Device,
) -> Linear<B> {
    let (out_dim, in_dim) = (spec.shape[0], spec.shape[1]);
    let weight = cpu_decode::linear_weight::<B>(&data, out_dim, in_dim, device).unwrap_or_else(|| {
        let mut transposed = vec![0.0f32; data.len()];
        for (o, row) in data.chunks_exact(in_dim).enumerate() {
            for (i, &w) in row.iter().enumerate() {
                transposed[i * out_dim + o] = w;
            }
        }
        tensor(transposed, &[in_dim, out_dim], device)
    });
    Linear {
        weight: Param::from_tensor(weight),
        bias: bias.map(|(spec, data)| Param::from_tensor(tensor(data, &spec.shape, device))),
    }
}
