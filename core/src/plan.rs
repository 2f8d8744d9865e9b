//! Memory and compute of a training step or of generation, from a model config alone
//! (`kiln plan`): what each part of the job holds at its peak, per device, and the FLOPs.
//!
//! Training (per device, the global batch split over data-parallel devices, each holding the
//! whole model): the peak is at the start of the backward pass, when every activation the
//! backward pass needs is alive next to the weights, the half-precision weight copies (mixed
//! precision), the optimizer state and the logits' gradient (f32 from the loss, and in the
//! compute dtype); or in the optimizer update, when gradients have replaced the activations.
//!
//! Activations are the tensors kiln's autodiff keeps per token and layer (`s` the compute
//! dtype's bytes; f32 where the model computes in f32 whatever the dtype):
//!
//! | where | kept | bytes per token |
//! |---|---|---|
//! | 2 RMSNorms | input in f32, normalised output | 2 · (4h + s·h) |
//! | q, k after RoPE | each input and its rotated half (none on CUDA: kiln's RoPE kernel) | 2s · (q + kv) |
//! | attention | q, k, v in f32, the output in f32 and one log-sum-exp per head (no scores: `model::chunked_attention`) | 4 · (q + 2kv) + 4 · (q + H) |
//! | o_proj | its input | s · q |
//! | SwiGLU MLP | gate, sigmoid(gate), silu, up, their product | 5s · i |
//!
//! (the scores exist for one chunk of queries at a time, at most 64 MiB, counted as the
//! "attention chunk"; on CUDA flash attention keeps none, `model::cube::attention`),
//! and the head: the final norm
//! and one f32 log-sum-exp per token (the LM head, log-softmax and gather are fused and chunked
//! over tokens, `model::head_loss`: one chunk's logits exist at a time; the CPU's fused f32 path
//! keeps the f32 logits instead). With `recompute` (per-layer checkpointing,
//! `model::checkpoint`) a layer keeps only its input (s · h; 4 · h on the fused path) and the
//! backward pass recomputes one layer at a time, under burn's `BalancedCheckpointing`, which
//! keeps only the outputs of matrix products and casts off the fused path:
//! s · (q + 2kv + 2h + 2i) + 4 · (2h + q) (+ 4 · (q + 2kv) in half precision) + 4 · (q + H), the
//! attention's own output and log-sum-exp; that layer is there, by the end of the backward pass,
//! with every gradient. The forms were checked against the peak resident memory of training
//! steps on the CPU (`tests/plan.rs` for the tiny model, `benches/plan_vs_rss.sh` for the 100M
//! one).
//!
//! FLOPs count multiply-adds as 2: a forward pass is 2 · (weights in matrix products) per token
//! plus 4 · T · q per token and layer for the scores and their weighted sum (kiln computes the
//! full T × T, masked), the backward pass twice that.

use serde::Serialize;

use crate::model::{Dtype, Qwen2Config};
use crate::train::Precision;

/// What to plan for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanRequest {
    /// Sequences per optimizer micro-batch (training) or decoded together (generation), over all
    /// devices.
    pub batch: usize,
    /// Tokens per sequence (training), or prompt plus generated tokens (generation).
    pub seq: usize,
    pub precision: Precision,
    /// Data-parallel devices (each holds the whole model and `batch / devices` sequences).
    pub devices: usize,
    pub recompute: bool,
    /// Training on the CPU backend, whose fused kernels (`model::fused`: attention, RoPE,
    /// RMSNorm, SwiGLU, token log-probs) keep fewer activations when the model computes in f32.
    pub cpu_kernels: bool,
    /// Training on CUDA, whose CubeCL kernels (`model::cube`) keep no attention scores at all
    /// (flash attention) and nothing for RoPE's backward pass. (wgpu runs the same kernels but
    /// declines long rows to the chunked form, lavapipe's loop limit: planned as without.)
    pub gpu_kernels: bool,
}

/// One part of the memory, in bytes per device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Part {
    pub name: &'static str,
    pub bytes: f64,
    pub note: String,
}

/// The plan of a training step and of generation at the same shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub parameters: usize,
    /// Sequences per device.
    pub batch_per_device: usize,
    pub seq: usize,
    pub precision: &'static str,
    pub recompute: bool,
    /// Training memory by part, per device.
    pub training: Vec<Part>,
    /// Activations of one decoder layer, per device.
    pub activations_per_layer: f64,
    /// Peak of a training step, per device: the larger of the backward-start and update phases.
    pub training_peak: f64,
    /// FLOPs of one training step over all devices (forward + backward).
    pub training_flops: f64,
    /// Generation in the compute dtype, per device: weights, KV cache, logits.
    pub generation: Vec<Part>,
    pub generation_peak: f64,
    /// FLOPs per generated token with a full cache of `seq` positions.
    pub decode_flops_per_token: f64,
}

/// Resident memory of a kiln training process beyond the plan's parts (binary, libraries,
/// thread stacks, allocator), measured on the CPU backend; device memory has no such part.
pub const CPU_RUNTIME_BYTES: f64 = 16.0 * 1024.0 * 1024.0;

/// Plans `request` for `config`.
pub fn plan(config: &Qwen2Config, request: PlanRequest) -> Plan {
    let (h, i, v, layers) = (config.hidden_size as f64, config.intermediate_size as f64, config.vocab_size as f64, config.num_hidden_layers as f64);
    let d = config.head_dim() as f64;
    let (heads, q, kv) = (config.num_attention_heads as f64, config.num_attention_heads as f64 * d, config.num_kv_heads() as f64 * d);
    let p = request.precision;
    let s = p.compute().size() as f64;
    let params = config.num_parameters() as f64;
    let layer_params = crate::model::weights::parameter_counts(config).layer as f64;
    let devices = request.devices.max(1);
    let batch = request.batch.div_ceil(devices);
    let t = request.seq as f64;
    let tokens = batch as f64 * t;

    // The CPU's fused f32 kernels keep no T × T scores: per token and layer about three
    // hidden-sized, 3.4 intermediate-sized and 3.75 query-sized f32 tensors (the norms' inputs and
    // outputs, the MLP's gate, up and product, q before and after RoPE, attention's output) and
    // K and V: 12.5 · h + 13.5 · i + 15 · q + 4 · kv bytes, fitted by `benches/plan_fit.py` on
    // 24 shapes from 1.3M to 100M parameters (peak RSS, one thread; each within ±6.5%).
    // bf16-mixed on a CPU with bf16 products keeps f32 activations (`Qwen2::with_compute_dtype`)
    // and no bf16 weight copies: the products read the f32 weights, and their backward passes
    // round the logits' gradient and the MLP's product to bf16 (2 · (v + i) bytes a token,
    // fitted the same way; each within ±7.5%).
    let fused = request.cpu_kernels && (p.compute() == Dtype::F32 || (p == Precision::Bf16Mixed && crate::model::fused::cpu_bf16_products()));
    let per_token_layer = if fused {
        12.5 * h + 13.5 * i + 15.0 * q + 4.0 * kv
    } else if request.recompute {
        // (Recomputation keeps no RoPE input either way.)
        let half = if p.compute().is_half() { 4.0 * (q + 2.0 * kv) } else { 0.0 };
        s * (q + 2.0 * kv + 2.0 * h + 2.0 * i) + 4.0 * (2.0 * h + q) + half + 4.0 * (q + heads)
    } else {
        let rope = if request.gpu_kernels { 0.0 } else { 2.0 * s * (q + kv) };
        2.0 * (4.0 * h + s * h) + rope + 4.0 * (q + 2.0 * kv) + 4.0 * (q + heads) + s * q + 5.0 * s * i
    };
    // With `recompute` (per-layer checkpointing, `model::checkpoint`) a layer keeps only its
    // input, in the activations' dtype (f32 on the fused path), until the backward pass
    // recomputes it; one layer's activations (`per_token_layer`) exist at a time.
    let layer_activations = per_token_layer * tokens;
    let input_bytes = if fused { 4.0 } else { s };
    let activations_per_layer = if request.recompute { input_bytes * h * tokens } else { layer_activations };
    // The head: on the fused CPU path the final norm's input and output, the logits and what
    // their loss keeps (28 · h + 6 · v bytes a token, fitted as above; with the logits' gradient
    // below, 10 · v), plus the bf16 rounding of the backward products; elsewhere the chunked head
    // (`model::head_loss`) keeps no logits, only the norm's input and output and one log-sum-exp
    // per token.
    let bf16_rounding = if fused && p.compute() != Dtype::F32 { 2.0 * (v + i) } else { 0.0 };
    let head = if fused { tokens * (28.0 * h + 6.0 * v + bf16_rounding) } else { tokens * (4.0 * h + s * h + 4.0) };
    let weights = params * p.weights().size() as f64;
    // Mixed precision off the fused path keeps the compute-dtype copy of every weight it casts;
    // with recompute only the recomputed layer's and the head's.
    let copied = match request.recompute {
        true => params - (layers - 1.0) * layer_params,
        false => params,
    };
    let copy = if p.compute() != p.weights() && !fused { copied * p.compute().size() as f64 } else { 0.0 };
    let state = 2.0 * params * p.weights().size() as f64;
    let grads = params * p.weights().size() as f64;
    // The update's temporaries for the largest tensor: the clipped gradient, the new moments,
    // the denominator, the step and the new weight.
    let largest = (v * h).max(h * i) * p.weights().size() as f64;
    // The plain operations' temporaries also leave allocator slack (size classes, buffers freed
    // out of order): +10% of the activations, measured on the CPU with mimalloc (the fused
    // kernels' figures above already include theirs).
    let slack = if fused { 1.0 } else { 1.1 };
    let activations = (activations_per_layer * layers + head) * slack;
    // At the start of the backward pass: the fused path's f32 logits gradient; the chunked
    // head's one chunk of logits (compute dtype and f32), probabilities and gradient, and the
    // f32 sum of the head weight's gradient.
    let rows = crate::model::head_loss::rows_per_chunk(tokens as usize, config.vocab_size, None) as f64;
    let logits_grad = if fused { tokens * v * 4.0 } else { rows * v * (12.0 + 2.0 * s) + 4.0 * v * h };
    // One chunk of attention's backward pass: the scores recomputed, their mask, the
    // probabilities, their gradient and its parts; the last layer's backward pass starts after
    // the head's and the MLP's kept tensors are freed, which leaves ≈ 4 chunk-sized f32 tensors
    // on top of the peak, with or without recompute (the allocator's reserved memory on wgpu,
    // `benches/wgpu_memory.sh`: 1,024–4,096 tokens).
    let chunk_rows = crate::model::chunked_attention::rows_per_chunk(batch, config.num_attention_heads, request.seq, request.seq, None);
    let attention_chunk = if fused || request.gpu_kernels { 0.0 } else { 4.0 * batch as f64 * heads * chunk_rows as f64 * t * 4.0 };
    let backward_start = weights + copy + state + activations + logits_grad + attention_chunk;
    let update = weights + state + grads + 6.0 * largest;
    // With recompute the layers' backward passes hold one recomputed layer and the gradient
    // `(y · g).backward()` starts from (the product, its seed of ones and the output's
    // gradient: 3 input-sized tensors). Memory moves linearly from the first of them (the last
    // layer: the other layers' inputs kept, and the gradients of everything outside the
    // layers) to the last (the first layer: every gradient), so the larger end is the peak.
    let recomputed = if request.recompute { (layer_activations + 3.0 * input_bytes * h * tokens) * slack } else { 0.0 };
    let outer_grads = (params - layers * layer_params) * p.weights().size() as f64;
    let (recompute_first, backward_end) = match request.recompute {
        true => (
            weights + copy + state + (layers - 1.0) * activations_per_layer * slack + outer_grads + recomputed + attention_chunk,
            weights + copy + state + grads + recomputed + attention_chunk,
        ),
        false => (0.0, 0.0),
    };
    let training = vec![
        part("weights", weights, format!("{} parameters in {}", config.num_parameters(), p.weights())),
        part("compute copy", copy, format!("the {} weight copies the backward pass keeps", p.compute())),
        part("gradients", grads, format!("in {}, during the update (the activations are gone by then)", p.weights())),
        part("optimizer state", state, format!("AdamW's two moments in {}", p.weights())),
        part("activations", activations, match request.recompute {
            true => format!("{} layers' inputs × {:.1} MiB + head {:.1} MiB (the layers recomputed one at a time)", layers, mib(activations_per_layer), mib(head)),
            false => format!("{} layers × {:.1} MiB + head {:.1} MiB", layers, mib(activations_per_layer), mib(head)),
        }),
        part("recomputed layer", recomputed, "one layer's activations in the backward pass, with the gradients made so far".into()),
        part("logits gradient", logits_grad, match fused {
            true => "f32, at the start of the backward pass".into(),
            false => format!("chunks of {rows} tokens' logits and the head weight's f32 gradient (no [tokens, V] logits)"),
        }),
        part("attention chunk", attention_chunk, match request.gpu_kernels {
            true => "none: flash attention's backward pass recomputes scores tile by tile".into(),
            false => format!("the backward pass's scores for {chunk_rows} queries at a time"),
        }),
        part("update temporaries", 6.0 * largest, "six tensors the size of the largest weight".into()),
    ];
    let per_token_flops = 2.0 * matmul_weights(config) + 4.0 * t * q * layers;
    let training_flops = 3.0 * per_token_flops * request.batch as f64 * t;

    let g = p.compute();
    let gs = g.size() as f64;
    let kv_cache = 2.0 * layers * kv * gs * tokens;
    let gen_weights = params * gs;
    let logits = batch as f64 * v * (gs + 4.0);
    // Attention scores exist for one chunk of queries at a time (`model::chunked_attention`).
    let prefill_rows = crate::model::chunked_attention::rows_per_chunk(batch, config.num_attention_heads, request.seq, request.seq, None);
    let prefill_scores = if request.gpu_kernels { 0.0 } else { batch as f64 * heads * prefill_rows as f64 * t * 4.0 };
    let generation = vec![
        part("weights", gen_weights, format!("in {g}")),
        part("KV cache", kv_cache, format!("{batch} sequences × {} positions × {} layers, {g}", request.seq, config.num_hidden_layers)),
        part("logits", logits, "one step's, and their f32 copy".into()),
        part("prefill scores", prefill_scores, match request.gpu_kernels {
            true => "none: flash attention".into(),
            false => format!("one layer's f32 attention scores for {prefill_rows} queries of the prompt at a time"),
        }),
    ];
    let generation_peak = gen_weights + kv_cache + logits.max(prefill_scores);
    Plan {
        parameters: config.num_parameters(),
        batch_per_device: batch,
        seq: request.seq,
        precision: p.name(),
        recompute: request.recompute,
        training,
        activations_per_layer,
        training_peak: backward_start.max(recompute_first).max(backward_end).max(update),
        training_flops,
        generation,
        generation_peak,
        decode_flops_per_token: 2.0 * matmul_weights(config) + 4.0 * t * q * layers,
    }
}

/// Weights that enter matrix products per token: every projection and the LM head (the
/// embedding lookup is not a product), from the model's tensor list.
fn matmul_weights(config: &Qwen2Config) -> f64 {
    crate::model::weights::parameter_counts(config).matmul as f64
}

fn part(name: &'static str, bytes: f64, note: String) -> Part {
    Part { name, bytes, note }
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

impl Plan {
    /// The plan as text: one line per part, GiB.
    pub fn render(&self) -> String {
        let gib = |b: f64| b / (1024.0 * 1024.0 * 1024.0);
        let mut out = format!(
            "{} parameters; {} sequences × {} tokens per device; precision {}{}\n\ntraining step (per device):\n",
            self.parameters,
            self.batch_per_device,
            self.seq,
            self.precision,
            if self.recompute { ", recompute" } else { "" }
        );
        for p in self.training.iter().filter(|p| p.bytes > 0.0) {
            out += &format!("  {:<20} {:>9.2} GiB  {}\n", p.name, gib(p.bytes), p.note);
        }
        out += &format!("  {:<20} {:>9.2} GiB  per layer\n", "activations/layer", gib(self.activations_per_layer));
        out += &format!("  {:<20} {:>9.2} GiB  (the largest of the backward pass's phases and the update)\n", "peak", gib(self.training_peak));
        out += &format!("  {:<20} {:>9.3e} FLOP (all devices)\n\ngeneration (per device):\n", "step", self.training_flops);
        for p in &self.generation {
            out += &format!("  {:<20} {:>9.2} GiB  {}\n", p.name, gib(p.bytes), p.note);
        }
        out += &format!("  {:<20} {:>9.2} GiB\n", "peak", gib(self.generation_peak));
        out += &format!("  {:<20} {:>9.3e} FLOP per token (full cache)\n", "decode", self.decode_flops_per_token);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen_1_5b() -> Qwen2Config {
        serde_json::from_str(
            r#"{"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                "tie_word_embeddings": true}"#,
        )
        .unwrap()
    }

    #[test]
    fn static_parts_follow_the_precision() {
        let c = qwen_1_5b();
        let request = PlanRequest { batch: 1, seq: 1024, precision: Precision::Bf16Mixed, devices: 1, recompute: false, cpu_kernels: false, gpu_kernels: false };
        let p = plan(&c, request);
        let get = |name: &str| p.training.iter().find(|x| x.name == name).unwrap().bytes;
        assert_eq!(p.parameters, 1_543_714_304);
        assert_eq!(get("weights"), 4.0 * 1_543_714_304.0);
        assert_eq!(get("compute copy"), 2.0 * 1_543_714_304.0);
        assert_eq!(get("optimizer state"), 8.0 * 1_543_714_304.0);
        let pure = plan(&c, PlanRequest { precision: Precision::Bf16Pure, ..request });
        assert_eq!(pure.training.iter().find(|x| x.name == "optimizer state").unwrap().bytes, 4.0 * 1_543_714_304.0);
        // Recomputation keeps less; two devices halve the activations of a batch of 2.
        let recompute = plan(&c, PlanRequest { recompute: true, ..request });
        assert!(recompute.activations_per_layer < 0.8 * p.activations_per_layer);
        let two = plan(&c, PlanRequest { batch: 2, devices: 2, ..request });
        assert_eq!(two.activations_per_layer, p.activations_per_layer);
        // 6 · N · tokens, plus attention.
        let flops = p.training_flops / 1024.0;
        assert!(flops > 6.0 * 1.54e9 && flops < 6.0 * 1.54e9 * 1.2, "{flops:e}");
        // bf16 KV cache: 2 · 28 layers · 256 · 2 bytes per position.
        let kv = p.generation.iter().find(|x| x.name == "KV cache").unwrap().bytes;
        assert_eq!(kv, 2.0 * 28.0 * 256.0 * 2.0 * 1024.0);
    }

    /// On CUDA flash attention keeps no scores and the RoPE kernel nothing: the
    /// attention chunk and the prefill scores are gone, and without recomputation each layer
    /// keeps 2s · (q + kv) bytes per token less.
    #[test]
    fn gpu_kernels_keep_no_scores() {
        let c = qwen_1_5b();
        let request = PlanRequest { batch: 1, seq: 16_384, precision: Precision::Bf16Mixed, devices: 1, recompute: false, cpu_kernels: false, gpu_kernels: false };
        let (plain, gpu) = (plan(&c, request), plan(&c, PlanRequest { gpu_kernels: true, ..request }));
        let get = |parts: &[Part], name: &str| parts.iter().find(|x| x.name == name).unwrap().bytes;
        assert!(get(&plain.training, "attention chunk") > 0.0 && get(&plain.generation, "prefill scores") > 0.0);
        assert_eq!((get(&gpu.training, "attention chunk"), get(&gpu.generation, "prefill scores")), (0.0, 0.0));
        // q = 12 · 128, kv = 2 · 128, bf16: 2 · 2 · 1792 bytes per token and layer.
        assert_eq!(plain.activations_per_layer - gpu.activations_per_layer, 4.0 * 1792.0 * 16_384.0);
        assert!(gpu.training_peak < plain.training_peak);
    }
}
