//! The Qwen2 causal language model (`Qwen2ForCausalLM`), read top to bottom:
//! embedding → N × [RMSNorm → GQA attention (q/k/v bias, RoPE) → residual →
//! RMSNorm → SwiGLU MLP → residual] → RMSNorm → LM head (tied to the embedding or not).
//!
//! Shapes: `B` batch, `T` new tokens, `S` all key positions (cache + new), `D` hidden size,
//! `H` query heads, `K` key/value heads, `G = H / K` query heads per KV head, `d` head size.

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::Embedding;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData, backend::Backend};

use super::checkpoint;
use super::chunked_attention;
use super::config::Qwen2Config;
use super::kernels::kernels;
use super::dtype::Dtype;
use super::fused::{self, KeyMask};
use super::inputs::Inputs;
use super::kv_cache::{KEY_BUCKET, KvCache, LayerCache};
use super::paged_kv::{PagedKv, SeqId};
use super::proj::{self, Proj};
use super::rope::{RopeTables, RotaryEmbedding};
use super::weights::Weights;
use crate::error::Result;

/// RMSNorm as `transformers` computes it: normalise in f32, cast back, then scale.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Reads `weight`.
    pub(crate) fn load(vb: &Weights<B>, eps: f64) -> Result<Self> {
        Ok(Self { weight: vb.get("weight")?, eps })
    }

    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        (kernels::<B>().rms_norm)(x, self.weight.val(), self.eps)
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`, no biases.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Proj<B>,
    pub up_proj: Proj<B>,
    pub down_proj: Proj<B>,
}

impl<B: Backend> Mlp<B> {
    pub(crate) fn load(vb: &Weights<B>) -> Result<Self> {
        Ok(Self {
            gate_proj: Proj::load(&vb.pp("gate_proj"))?,
            up_proj: Proj::load(&vb.pp("up_proj"))?,
            down_proj: Proj::load(&vb.pp("down_proj"))?,
        })
    }

    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [gate, up] = proj::project_all(x, [&self.gate_proj, &self.up_proj]);
        self.down_proj.forward((kernels::<B>().swiglu)(gate, up))
    }
}

/// Grouped-query self-attention with biased q/k/v projections and an unbiased output projection.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Proj<B>,
    pub k_proj: Proj<B>,
    pub v_proj: Proj<B>,
    pub o_proj: Proj<B>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl<B: Backend> Attention<B> {
    pub(crate) fn load(config: &Qwen2Config, vb: &Weights<B>) -> Result<Self> {
        Ok(Self {
            q_proj: Proj::load(&vb.pp("q_proj"))?,
            k_proj: Proj::load(&vb.pp("k_proj"))?,
            v_proj: Proj::load(&vb.pp("v_proj"))?,
            o_proj: Proj::load(&vb.pp("o_proj"))?,
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_kv_heads(),
            head_dim: config.head_dim(),
        })
    }

    /// `x` `[B, T, D]`; `mask` from [`AttnMask::new`].
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &RopeTables<B>,
        mask: &AttnMask<B>,
        cache: Option<&mut LayerCache<B>>,
    ) -> Tensor<B, 3> {
        if let AttnMask::Keys(keys) = mask {
            return self.forward_fused(x, rope, keys, cache);
        }
        let [batch, seq, _] = x.dims();
        let (heads, kv_heads, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        // RoPE (the backend's kernel) on the projections' layout `[B, T, n, d]`, then heads first.
        let split = |y: Tensor<B, 3>, n: usize| y.reshape([batch, seq, n, d]);
        let q = rope.apply_seq_major(split(self.q_proj.forward(x.clone()), heads)).swap_dims(1, 2); // [B, H, T, d]
        let k = rope.apply_seq_major(split(self.k_proj.forward(x.clone()), kv_heads)).swap_dims(1, 2); // [B, K, T, d]
        let v = split(self.v_proj.forward(x), kv_heads).swap_dims(1, 2); // [B, K, T, d]
        let (k, v) = match cache {
            Some(cache) => cache.append_padded(k, v, 2, mask.keys()), // [B, K, S, d]
            None => (k, v),
        };

        // The flash kernels read half precision themselves and accumulate in f32.
        let dtype = q.dtype();
        let flash = match mask {
            AttnMask::Flash(key_valid) => kernels::<B>().flash_attention.and_then(|flash| flash(q.clone(), k.clone(), v.clone(), key_valid)),
            _ => None,
        };
        let out = flash.unwrap_or_else(|| Self::attend_f32(q, k, v, mask)); // [B, H, T, d]
        let out = proj::to_dtype(out, dtype);
        let out = out.swap_dims(1, 2).reshape([batch, seq, heads * d]);
        self.o_proj.forward(out)
    }

    /// Attention as operations of any backend: q `[B, H, T, d]`, k and v `[B, K, S, d]`, the
    /// output `[B, H, T, d]` in q's dtype. Half precision: scores, softmax and the weighted sum
    /// in f32 (as flash attention and torch's CPU kernels accumulate), the result rounded once.
    fn attend_f32(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: &AttnMask<B>) -> Tensor<B, 4> {
        let [batch, heads, seq, d] = q.dims();
        let kv_heads = k.dims()[1];
        let (dtype, f32) = (q.dtype(), |t: Tensor<B, 4>| proj::to_dtype(t, DType::F32));
        let (q, k, v) = (f32(q), f32(k), f32(v));
        let chunked = |q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>, key_valid: &Tensor<B, 2, Int>, rows: usize| {
            kernels::<B>()
                .chunked_attention
                .and_then(|attention| attention(q.clone(), k.clone(), v.clone(), key_valid, rows))
                .unwrap_or_else(|| chunked_attention::forward(q, k, v, key_valid, rows).0)
        };
        let out = match mask {
            AttnMask::Dense(mask) => {
                // Fold the G query heads of each KV group into the query axis instead of
                // repeating K and V G times: query head h = k·G + g reads KV head k, as
                // `repeat_kv` does.
                let q = q.reshape([batch, kv_heads, (heads / kv_heads) * seq, d]);
                // f32: kiln's operations (burn's attention op was 8.8e-3 off transformers on
                // wgpu, see `masked`). Half-precision activations keep burn's op: on wgpu, f16
                // decoding from the cache through `masked` was measured 8.6 off a full recompute
                // in log-prob (tests/half_precision.rs), through burn's op within f16 rounding.
                let out = if dtype == DType::F32 {
                    chunked_attention::masked(q, k, v, mask.clone()) // [B, K, G·T, d]
                } else {
                    let options = burn::tensor::ops::AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
                    burn::tensor::module::attention(q, k, v, Some(mask.clone()), None, options)
                };
                out.reshape([batch, heads, seq, d])
            }
            // Chunks of queries, with their own backward pass where installed (training).
            AttnMask::Chunked { key_valid, rows } => chunked(&q, &k, &v, key_valid, *rows),
            // Flash attention declined (a head size over 256, or past wgpu's loop budget).
            AttnMask::Flash(key_valid) => {
                let rows = chunked_attention::rows_per_chunk(batch, heads, seq, key_valid.dims()[1], kiln_backends::device::max_buffer::<B>(&q.device()));
                chunked(&q, &k, &v, key_valid, rows)
            }
            AttnMask::Keys(_) => unreachable!("the fused path takes these"),
        };
        proj::to_dtype(out, dtype)
    }

    /// The same on the fused CPU path (`model::fused`): heads stay where the projections put
    /// them (`[B, T, H, d]`, no transposes), the cache is `[B, S, K, d]`, and the mask is never
    /// materialised.
    fn forward_fused(&self, x: Tensor<B, 3>, rope: &RopeTables<B>, mask: &KeyMask, cache: Option<&mut LayerCache<B>>) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let (heads, kv_heads, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let [q, k, v] = proj::project_all(x, [&self.q_proj, &self.k_proj, &self.v_proj]);
        let q = rope.apply_seq_major(q.reshape([batch, seq, heads, d]));
        let k = rope.apply_seq_major(k.reshape([batch, seq, kv_heads, d]));
        let v = v.reshape([batch, seq, kv_heads, d]);
        let (k, v) = match cache {
            Some(cache) => cache.append_along(k, v, 1),
            None => (k, v),
        };
        let out = fused::attention(q, k, v, mask).expect("AttnMask::new chose the fused path for this backend and dtype");
        self.o_proj.forward(out.reshape([batch, seq, heads * d]))
    }

    /// One decoding step from a paged KV cache (host blocks on the fused CPU path, f32; device
    /// pools on wgpu/CUDA): `x` `[R, 1, D]`, one row per sequence of `seqs`, whose keys and
    /// values at this position are written to layer `layer` of `cache` ([`PagedKv::reserve`]d
    /// by the caller) before attending.
    fn forward_paged(&self, x: Tensor<B, 3>, rope: &RopeTables<B>, cache: &mut PagedKv<B>, layer: usize, seqs: &[SeqId]) -> Tensor<B, 3> {
        let [rows, seq, _] = x.dims();
        assert_eq!(seq, 1, "a paged KV cache decodes one position per sequence");
        let (heads, kv_heads, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let device = x.device();
        let [q, k, v] = proj::project_all(x, [&self.q_proj, &self.k_proj, &self.v_proj]);
        let q = rope.apply_seq_major(q.reshape([rows, 1, heads, d]));
        let k = rope.apply_seq_major(k.reshape([rows, 1, kv_heads, d]));
        let out = if cache.is_on_device() {
            cache.write_and_attend(layer, q.reshape([rows, heads, d]), k.reshape([rows, kv_heads, d]), v.reshape([rows, kv_heads, d])).reshape([rows, 1, heads * d])
        } else {
            let host = |t: Tensor<B, 4>| t.into_data().into_vec::<f32>().expect("f32 activations on the fused path");
            cache.write(layer, seqs, &host(k), &host(v.reshape([rows, 1, kv_heads, d])));
            let out = cache.attend(layer, seqs, &host(q), heads);
            Tensor::from_data(TensorData::new(out, [rows, 1, heads * d]), &device)
        };
        self.o_proj.forward(out)
    }
}

/// How attention learns which keys each query may see.
#[derive(Debug, Clone)]
pub enum AttnMask<B: Backend> {
    /// `[B, K, G·T, S]` from [`attention_mask`] ([`chunked_attention::masked`]), where the scores are
    /// small enough to exist at once and no chunked backward pass is installed.
    Dense(Tensor<B, 4, Bool>),
    /// Which keys are real (`[B, S]` labels, as [`attention_mask`]) for [`chunked_attention`], `rows` queries at a
    /// time: with its own backward pass where [`custom_op::install`]ed (training), else as plain
    /// operations.
    Chunked { key_valid: Tensor<B, 2, Int>, rows: usize },
    /// Which keys are real (labels, as [`attention_mask`]), for the fused CPU kernel, which
    /// derives causality itself.
    Keys(KeyMask),
    /// Which keys are real (`[B, S]` labels), for the backend's flash attention
    /// ([`super::kernels::Kernels::flash_attention`]), which derives causality itself.
    Flash(Tensor<B, 2, Int>),
}

impl<B: Backend> AttnMask<B> {
    /// Whether activations of `dtype` take the fused CPU kernel (no dense mask or scores).
    pub fn is_fused(dtype: DType) -> bool {
        (kernels::<B>().fused_attention)(dtype)
    }

    /// The mask for `queries` new tokens over keys `key_valid` `[B, S]` (1 = real token), in the
    /// form the attention of backend `B` and activations of `dtype` take.
    pub fn new(key_valid: Tensor<B, 2, Int>, queries: usize, kv_heads: usize, group: usize, dtype: DType) -> Self {
        Self::padded(key_valid, queries, 0, kv_heads, group, dtype)
    }

    /// [`AttnMask::new`], hiding `pad` more keys after the queries' own where the dense form is
    /// taken (decoding from a cache on the GPU backends: see [`KEY_BUCKET`]); the other forms
    /// take none.
    pub fn padded(key_valid: Tensor<B, 2, Int>, queries: usize, pad: usize, kv_heads: usize, group: usize, dtype: DType) -> Self {
        if Self::is_fused(dtype) {
            let [batch, keys] = key_valid.dims();
            let valid: Vec<u32> = key_valid.into_data().convert::<i64>().iter::<i64>().map(|v| v.max(0) as u32).collect();
            return Self::Keys(KeyMask { batch, keys, valid: valid.into() });
        }
        if kernels::<B>().flash_attention.is_some() {
            return Self::Flash(key_valid);
        }
        let device = key_valid.device();
        let [batch, keys] = key_valid.dims();
        let heads = kv_heads * group;
        let max_buffer = kiln_backends::device::max_buffer::<B>(&device);
        let rows = chunked_attention::rows_per_chunk(batch, heads, queries, keys, max_buffer);
        if kernels::<B>().chunked_attention.is_some() || rows < queries {
            // One chunk's scores must fit the device's buffers even at one query.
            kiln_backends::device::ensure_fits::<B>(
                &device,
                chunked_attention::dense_bytes(batch, heads, rows, keys),
                || format!("attention scores [{batch}, {heads}, {rows}, {keys}] f32"),
                "use a shorter sequence or a smaller batch",
            );
            return Self::Chunked { key_valid, rows };
        }
        if pad > 0 && chunked_attention::rows_per_chunk(batch, heads, queries, keys + pad, max_buffer) == queries {
            let key_valid = Tensor::cat(vec![key_valid, Tensor::zeros([batch, pad], &device)], 1);
            return Self::Dense(chunked_attention::chunk_mask_before(&key_valid, queries, 0, queries, pad, kv_heads, group));
        }
        Self::Dense(attention_mask(key_valid, queries, kv_heads, group))
    }

    /// The keys attended over: the cached and new ones, and the padding after them.
    pub fn keys(&self) -> usize {
        match self {
            Self::Dense(mask) => mask.dims()[3],
            Self::Chunked { key_valid, .. } | Self::Flash(key_valid) => key_valid.dims()[1],
            Self::Keys(keys) => keys.keys,
        }
    }
}

/// The attention mask `[B, K, G·T, S]` (true = masked) for `T` new queries over `S` keys, whose
/// last `T` are the new tokens (`key_valid` `[B, S]` labels keys: 0 padding, else the key's
/// document, 1 for every real token unpacked): a query sees itself and the earlier real keys of
/// its document, so no softmax row is empty (see [`chunked_attention::chunk_mask`]).
pub fn attention_mask<B: Backend>(
    key_valid: Tensor<B, 2, Int>,
    queries: usize,
    kv_heads: usize,
    group: usize,
) -> Tensor<B, 4, Bool> {
    chunked_attention::chunk_mask(&key_valid, queries, 0, queries, kv_heads, group)
}

/// One pre-norm decoder block.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    pub(crate) fn load(config: &Qwen2Config, vb: &Weights<B>) -> Result<Self> {
        Ok(Self {
            input_layernorm: RmsNorm::load(&vb.pp("input_layernorm"), config.rms_norm_eps)?,
            self_attn: Attention::load(config, &vb.pp("self_attn"))?,
            post_attention_layernorm: RmsNorm::load(&vb.pp("post_attention_layernorm"), config.rms_norm_eps)?,
            mlp: Mlp::load(&vb.pp("mlp"))?,
        })
    }

    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &RopeTables<B>,
        mask: &AttnMask<B>,
        cache: Option<&mut LayerCache<B>>,
    ) -> Tensor<B, 3> {
        let h = x.clone() + self.self_attn.forward(self.input_layernorm.forward(x), rope, mask, cache);
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }

    /// [`DecoderLayer::forward`] for one decoding step from a paged KV cache
    /// ([`Qwen2::decode_paged`]).
    fn forward_paged(&self, x: Tensor<B, 3>, rope: &RopeTables<B>, cache: &mut PagedKv<B>, layer: usize, seqs: &[SeqId]) -> Tensor<B, 3> {
        let h = x.clone() + self.self_attn.forward_paged(self.input_layernorm.forward(x), rope, cache, layer, seqs);
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

/// `Qwen2ForCausalLM`.
#[derive(Module, Debug)]
pub struct Qwen2<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `None` when `tie_word_embeddings`: the head is the transposed embedding.
    pub lm_head: Option<Proj<B>>,
    pub rope: RotaryEmbedding<B>,
    #[module(skip)]
    pub config: Qwen2Config,
    /// Token ids that end generation by default (see [`Qwen2::eos_token_ids`]).
    #[module(skip)]
    pub eos_token_ids: Vec<u32>,
    /// The activations' dtype when it differs from the weights' (mixed precision: f32 weights,
    /// bf16 activations); see [`Qwen2::compute_dtype`].
    #[module(skip)]
    pub compute: Option<Dtype>,
}

impl<B: Backend> Qwen2<B> {
    /// Builds the model from the checkpoint tensors under `vb` (the checkpoint's root; see
    /// [`Qwen2::from_source`]). Field names are HF's, so parameter paths are checkpoint names.
    pub(crate) fn load(config: &Qwen2Config, vb: &Weights<B>) -> Result<Self> {
        let body = vb.pp("model");
        let embed_tokens = Embedding { weight: body.pp("embed_tokens").get("weight")? };
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::load(config, &body.pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed_tokens,
            layers,
            norm: RmsNorm::load(&body.pp("norm"), config.rms_norm_eps)?,
            lm_head: match config.tie_word_embeddings {
                true => None,
                false => Some(Proj::load(&vb.pp("lm_head"))?),
            },
            rope: RotaryEmbedding::new(config.head_dim(), config.rope_theta(), config.max_position_embeddings, vb.device()),
            config: config.clone(),
            eos_token_ids: config.eos_token_ids(),
            compute: None,
        })
    }

    /// Final hidden states `[B, T, D]` (after the last norm) for `inputs`. With a cache, the
    /// inputs continue the cached sequences and are appended to the cache.
    pub fn forward_hidden(&self, inputs: &Inputs<B>, cache: Option<&mut KvCache<B>>) -> Tensor<B, 3> {
        self.forward_layers(inputs, cache, |_, _| {})
    }

    /// Final hidden states `[B, T, D]` of a prefill whose keys and values go straight into a
    /// paged cache, a layer at a time (each layer's dropped as soon as its blocks hold it: the
    /// whole model's batch-shaped cache never exists): row `r` of `inputs` (left-padded
    /// prompts, no cache before them) goes to sequence `seqs[r]`, made by [`PagedKv::insert`]
    /// with the prompt's length.
    pub fn prefill_paged(&self, inputs: &Inputs<B>, pages: &mut PagedKv<B>, seqs: &[SeqId]) -> Tensor<B, 3> {
        let slots = pages.prefill_slots(seqs);
        let mut cache = self.new_cache();
        self.forward_layers(inputs, Some(&mut cache), |i, layer| {
            let (k, v) = layer.take_seq_major().expect("a layer's prefill fills its cache");
            pages.fill_layer(i, k, v, seqs, slots.as_ref());
        })
    }

    /// [`Qwen2::forward_hidden`], handing each layer's cache to `layer_done` after the layer.
    fn forward_layers(&self, inputs: &Inputs<B>, mut cache: Option<&mut KvCache<B>>, mut layer_done: impl FnMut(usize, &mut LayerCache<B>)) -> Tensor<B, 3> {
        let queries = inputs.ids.dims()[1];
        // Key labels: 0 padding, else the key's document + 1 (1 for every real token unpacked).
        let valid = match &inputs.documents {
            Some(documents) => {
                assert!(cache.is_none(), "packed rows (Inputs::documents) are not decoded from a KV cache");
                inputs.valid.clone().int() * (documents.clone() + 1)
            }
            None => inputs.valid.clone().int(),
        };
        let (key_valid, decoding) = match cache.as_deref_mut() {
            Some(cache) => {
                let (all, decoding) = match cache.key_valid.take() {
                    Some(old) => (Tensor::cat(vec![old, valid], 1), true),
                    None => (valid, false),
                };
                cache.key_valid = Some(all.clone());
                (all, decoding)
            }
            None => (valid, false),
        };
        // Decoding on a GPU backend: keys rounded up to a multiple of KEY_BUCKET (the rest hidden).
        let keys = key_valid.dims()[1];
        let pad = match decoding && !kernels::<B>().host_memory {
            true => keys.next_multiple_of(KEY_BUCKET) - keys,
            false => 0,
        };
        let kv_heads = self.config.num_kv_heads();
        let group = self.config.num_attention_heads / kv_heads;
        let rope = self.rope.tables(inputs.positions.clone());

        let mut x = self.embed(inputs.ids.clone());
        let mask = AttnMask::padded(key_valid, queries, pad, kv_heads, group, x.dtype());
        // Taped layer by layer (checkpointed, or split for an overlapped all-reduce) when training
        // (parameters that take gradients) asks for it.
        let trains = || self.embed_tokens.weight.val().is_require_grad() || self.layers.iter().any(|l| l.input_layernorm.weight.val().is_require_grad());
        let recompute = kernels::<B>().layer_checkpoints;
        if cache.is_none() && checkpoint::taping(recompute) && trains() {
            x = checkpoint::forward(self, &inputs.ids, x, &rope, &mask, recompute);
        } else {
            for (i, layer) in self.layers.iter().enumerate() {
                match cache.as_deref_mut() {
                    Some(cache) => {
                        x = layer.forward(x, &rope, &mask, Some(&mut cache.layers[i]));
                        layer_done(i, &mut cache.layers[i]);
                    }
                    None => x = layer.forward(x, &rope, &mask, None),
                }
            }
        }
        self.norm.forward(x)
    }

    /// An empty paged KV cache for this model, where decoding takes one
    /// ([`Qwen2::decode_paged`]): in host memory on the Flex backend with f32 activations, in
    /// device memory where the backend has a flash-decoding kernel (wgpu, CUDA); `None`
    /// elsewhere.
    pub fn new_paged_kv(&self) -> Option<PagedKv<B>> {
        let (layers, kv_heads, d) = (self.config.num_hidden_layers, self.config.num_kv_heads(), self.config.head_dim());
        let dtype = self.activation_dtype();
        if crate::model::fused::is_flex::<B>() && dtype == Dtype::F32 && AttnMask::<B>::is_fused(DType::F32) {
            return Some(PagedKv::new(layers, kv_heads, d));
        }
        kernels::<B>().paged_decode.map(|_| PagedKv::on_device(layers, kv_heads, d, dtype.burn(), &self.device()))
    }

    /// Final hidden states `[R, 1, D]` of one decoding step from a paged KV cache (from
    /// [`Qwen2::new_paged_kv`]): row `r` of `inputs` (`[R, 1]`) continues sequence `seqs[r]`,
    /// whose keys and values at this position join the cache.
    pub fn decode_paged(&self, inputs: &Inputs<B>, cache: &mut PagedKv<B>, seqs: &[SeqId]) -> Tensor<B, 3> {
        cache.reserve(seqs);
        let rope = self.rope.tables(inputs.positions.clone());
        let mut x = self.embed(inputs.ids.clone());
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward_paged(x, &rope, cache, i, seqs);
        }
        cache.advance(seqs);
        self.norm.forward(x)
    }

    /// The embeddings of `ids` `[B, T]` in the activations' dtype: `[B, T, D]`.
    pub(crate) fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = self.embed_tokens.forward(ids);
        match self.compute {
            Some(_) => proj::to_dtype(x, self.activation_dtype().burn()),
            None => x,
        }
    }

    /// Logits `[B, T, V]` from hidden states `[B, T, D]`.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, _] = hidden.dims();
        let vocab = self.config.vocab_size;
        kiln_backends::device::ensure_fits::<B>(
            &hidden.device(),
            (batch * seq * vocab * 4) as u64,
            || format!("logits [{batch}, {seq}, {vocab}] f32"),
            "score fewer tokens at once (a smaller batch or sequence)",
        );
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            // Tied: the embedding `[V, D]` is the head's HF `[out, in]`.
            None => proj::project_with(hidden, self.embed_tokens.weight.val().transpose(), None, self.products()),
        }
    }

    /// Whether the LM head has a bias (an untied head loaded with `lm_head.bias`; Qwen2's has none).
    pub fn head_has_bias(&self) -> bool {
        self.lm_head.as_ref().is_some_and(|head| head.bias.is_some())
    }

    /// The LM head as a weight `[D, V]` in `dtype` (the activations') and its bias `[V]`, if any.
    pub fn head(&self, dtype: DType) -> (Tensor<B, 2>, Option<Tensor<B, 1>>) {
        match &self.lm_head {
            Some(head) => (proj::to_dtype(head.weight.val(), dtype), head.bias.as_ref().map(|b| proj::to_dtype(b.val(), dtype))),
            None => (proj::to_dtype(self.embed_tokens.weight.val(), dtype).transpose(), None),
        }
    }

    /// Logits `[B, T, V]` for every position of `inputs` (no cache).
    pub fn forward(&self, inputs: &Inputs<B>) -> Tensor<B, 3> {
        self.logits(self.forward_hidden(inputs, None))
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.layers.len())
    }

    /// The model's config.
    pub fn config(&self) -> &Qwen2Config {
        &self.config
    }

    /// The device the model's parameters live on.
    pub fn device(&self) -> B::Device {
        self.embed_tokens.weight.device()
    }

    /// The longest sequence the model can process (`max_position_embeddings`).
    pub fn context_len(&self) -> usize {
        self.rope.max_positions()
    }

    /// The dtype of the weights (f32 also for a backend whose default float is wider).
    pub fn dtype(&self) -> Dtype {
        Dtype::from_burn(self.embed_tokens.weight.val().dtype()).unwrap_or_default()
    }

    /// The dtype activations are computed in: the weights' unless set by
    /// [`Qwen2::with_compute_dtype`]. Projections and norms cast their weights to it where
    /// they are used, and attention and the loss compute in f32 whatever it is.
    pub fn compute_dtype(&self) -> Dtype {
        self.compute.unwrap_or_else(|| self.dtype())
    }

    /// The model computing in `dtype` with its weights as they are (mixed precision: f32
    /// weights with bf16 or f16 activations; under autodiff, gradients reach the f32 weights).
    ///
    /// bf16 on a backend with [`Kernels::bf16_products`](super::kernels::Kernels) (Flex on CPUs
    /// with AVX512-BF16) keeps the activations in f32 and rounds to bf16 only the operands of
    /// the projections' products (forward and backward), as `torch.autocast` rounds what its
    /// matmuls read: every product is a bf16 one, and the f32 kernels serve everything else.
    pub fn with_compute_dtype(mut self, dtype: Dtype) -> Self {
        self.compute = Some(dtype);
        let products = (dtype == Dtype::BF16 && kernels::<B>().bf16_products.is_some()).then_some(dtype);
        self.set_products(products);
        self
    }

    /// The dtype activations (and the KV cache) are kept in: the compute dtype, but f32 where
    /// the projections round their operands instead ([`Qwen2::products`]).
    pub fn activation_dtype(&self) -> Dtype {
        if self.products().is_some() { Dtype::F32 } else { self.compute_dtype() }
    }

    /// The dtype the projections round their operands to when the activations stay f32
    /// (see [`Qwen2::with_compute_dtype`]).
    pub fn products(&self) -> Option<Dtype> {
        self.layers.first().and_then(|l| l.mlp.up_proj.products)
    }

    /// Sets (or, with `None`, clears: activations then in the compute dtype) the projections'
    /// product rounding of [`Qwen2::with_compute_dtype`].
    pub(crate) fn set_products(&mut self, products: Option<Dtype>) {
        for layer in &mut self.layers {
            let (a, m) = (&mut layer.self_attn, &mut layer.mlp);
            for p in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj, &mut m.gate_proj, &mut m.up_proj, &mut m.down_proj] {
                p.products = products;
            }
        }
        if let Some(head) = &mut self.lm_head {
            head.products = products;
        }
    }

    /// The model with every weight in `dtype` (and activations in it).
    pub fn cast(self, dtype: Dtype) -> Self {
        let mut model = self.map(&mut CastParams(dtype.burn()));
        model.compute = None;
        model.set_products(None);
        model
    }

    /// The model with weights and activations in `dtype`: itself when they already are, else a
    /// cast copy (for sampling from a mixed-precision model without casting every weight at
    /// every step).
    pub fn in_dtype(self, dtype: Dtype) -> Self {
        if self.dtype() == dtype && self.compute_dtype() == dtype { self } else { self.cast(dtype) }
    }

    /// The end-of-sequence ids generation stops at by default: `eos_token_id` of `config.json`
    /// and, for a model loaded from a directory, of `generation_config.json`.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }
}

/// Casts every float parameter to one dtype, keeping parameter ids; under autodiff the cast
/// parameters are new leaves (they receive the gradients), not views of the old ones.
struct CastParams(DType);

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|t| {
            if t.dtype() == dtype {
                return t;
            }
            let leaf = t.is_require_grad();
            let t = t.cast(dtype).detach();
            if leaf { t.require_grad() } else { t }
        })
    }
}
