//! Half-precision parity with Python `transformers` run in the same dtype
//! (`tests/fixtures/make_half_fixtures.py`): logits of the reference models in bf16 and f16 on
//! the CPU backend, and in f16 on wgpu (lavapipe has `SHADER_F16`; WGSL has no bf16).
//!
//! Tolerances. Two valid half-precision implementations differ by the rounding of intermediate
//! results (relative 2⁻⁹ per rounding in bf16, 2⁻¹² in f16), amplified through the layers: on
//! these models (init σ 0.25, |logit| ≤ 7.6) `transformers` moves its own logits by up to 0.23
//! (bf16) and 0.023 (f16) when only its attention kernel changes (`sdpa` → `eager`, recorded in
//! `half.json`). So each test asserts, over the real positions of a padded batch and of each
//! sequence alone:
//! - max |kiln − transformers| ≤ 0.25 (bf16), 0.03 (f16): no error beyond half precision's own,
//!   which catches wrong positions, masks, heads or weights (errors of 1 and more);
//! - mean |kiln − transformers| ≤ mean |transformers(dtype) − transformers(f32)|: kiln is at
//!   least as close to transformers in that dtype as an exact f32 computation is; and
//! - mean |kiln(dtype) − kiln(f32)| ≥ ½ · mean |transformers(dtype) − transformers(f32)|: kiln
//!   really computes in the reduced precision (an f32 computation would show ≈ 0 here).

mod common;

use burn::tensor::backend::Backend;
use common::{HF_MODELS, Reference, max_abs_diff};
use kiln::model::{Dtype, HostBatch, Qwen2, hf};

fn logits_host<B: Backend>(model: &Qwen2<B>, batch: &HostBatch, device: &B::Device) -> Vec<f32> {
    model.forward(&batch.to_device::<B>(device)).into_data().convert::<f32>().into_vec().unwrap()
}

/// Largest and mean absolute difference over `ranges` of `a` and `b`.
fn diff(a: &[f32], b: &[f32], ranges: &[std::ops::Range<usize>]) -> (f32, f64) {
    let (mut max, mut sum, mut n) = (0f32, 0f64, 0usize);
    for r in ranges {
        for (x, y) in a[r.clone()].iter().zip(&b[r.clone()]) {
            max = max.max((x - y).abs());
            sum += (x - y).abs() as f64;
            n += 1;
        }
    }
    (max, sum / n as f64)
}

fn logits_match<B: Backend>(device: &B::Device, dtype: Dtype, max_tolerance: f32) {
    for name in HF_MODELS {
        let reference = Reference::load(name);
        let half = reference.file_tensors("half.safetensors");
        let model = hf::load_as::<B>(&reference.dir, device, dtype).unwrap();
        assert_eq!((model.dtype(), model.compute_dtype()), (dtype, dtype));
        let f32_model = hf::load::<B>(&reference.dir, device).unwrap();
        let vocab = model.config().vocab_size;
        let seqs = &reference.expected.sequences;

        let batch = HostBatch::left_padded(seqs, reference.expected.pad_id).unwrap();
        let ours = logits_host(&model, &batch, device);
        let ours_f32 = logits_host(&f32_model, &batch, device);
        let (_, theirs) = half(&format!("{dtype}.batch.logits"));
        let (_, theirs_f32) = reference.tensor("batch.logits");
        let real: Vec<_> =
            seqs.iter().enumerate().map(|(i, s)| (i * batch.seq + batch.seq - s.len()) * vocab..(i + 1) * batch.seq * vocab).collect();
        let (max, mean) = diff(&ours, &theirs, &real);
        let (_, rounding) = diff(&theirs, &theirs_f32, &real);
        let (_, own_rounding) = diff(&ours, &ours_f32, &real);
        eprintln!("{name}/{dtype}: max |Δ| {max:.4}, mean {mean:.5}; transformers vs f32 {rounding:.5}, kiln vs f32 {own_rounding:.5}");
        assert!(max <= max_tolerance, "{name}/{dtype}: padded batch: max |Δ| = {max}");
        assert!(mean <= rounding, "{name}/{dtype}: mean |Δ| {mean} exceeds transformers' own rounding {rounding}");
        assert!(own_rounding >= 0.5 * rounding, "{name}/{dtype}: kiln barely differs from f32 ({own_rounding} vs {rounding})");

        for (i, seq) in seqs.iter().enumerate() {
            let alone = HostBatch::left_padded(std::slice::from_ref(seq), 0).unwrap();
            let (_, single) = half(&format!("{dtype}.single.{i}.logits"));
            let max = max_abs_diff(&logits_host(&model, &alone, device), &single);
            assert!(max <= max_tolerance, "{name}/{dtype}: sequence {i} alone: max |Δ| = {max}");
        }
    }
}

/// Greedy decoding with the KV cache in half precision gives the log-probs of a full recompute
/// of the final sequences (to half precision's rounding: a cache bug is an error of 1 or more).
fn cache_matches_recompute<B: Backend>(device: &B::Device, dtype: Dtype, tolerance: f32) {
    use kiln::generate::{Engine, Sampler, SamplingParams};
    use kiln::model::logprobs::sequence_logprobs;
    for name in HF_MODELS {
        let reference = Reference::load(name);
        let model = hf::load_as::<B>(&reference.dir, device, dtype).unwrap();
        let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 12, ..Default::default() };
        let out = Engine::new(&model, None).generate(&reference.expected.sequences, &params, |_| {}).unwrap();
        for (i, samples) in out.iter().enumerate() {
            let prompt = &reference.expected.sequences[i];
            let full: Vec<u32> = prompt.iter().chain(&samples[0].token_ids).copied().collect();
            let recomputed = sequence_logprobs(&model, &[full], 5).unwrap().remove(0);
            let recomputed: Vec<f32> = recomputed[prompt.len()..].iter().map(|x| x.unwrap()).collect();
            let max = max_abs_diff(&samples[0].raw_logprobs, &recomputed);
            assert!(max <= tolerance, "{name}/{dtype}: KV-cache vs full recompute: max |Δ logprob| = {max}");
        }
    }
}

mod cpu {
    use kiln::backends::Cpu;
    use kiln::model::Dtype;

    #[test]
    fn bf16_logits_match_transformers_in_bf16() {
        super::logits_match::<Cpu>(&Default::default(), Dtype::BF16, 0.25);
    }

    #[test]
    fn f16_logits_match_transformers_in_f16() {
        super::logits_match::<Cpu>(&Default::default(), Dtype::F16, 0.03);
    }

    #[test]
    fn half_precision_cache_matches_recompute() {
        super::cache_matches_recompute::<Cpu>(&Default::default(), Dtype::BF16, 0.25);
        super::cache_matches_recompute::<Cpu>(&Default::default(), Dtype::F16, 0.03);
    }
}

/// CUDA (run by `scripts/gpu-check.sh`; compiled, not run, where there is no GPU).
#[cfg(feature = "cuda")]
mod cuda {
    use kiln::backends::Cuda;
    use kiln::model::Dtype;

    #[test]
    fn bf16_logits_match_transformers_in_bf16() {
        super::logits_match::<Cuda>(&Default::default(), Dtype::BF16, 0.25);
    }

    #[test]
    fn f16_logits_match_transformers_in_f16() {
        super::logits_match::<Cuda>(&Default::default(), Dtype::F16, 0.03);
    }

    #[test]
    fn half_precision_cache_matches_recompute() {
        super::cache_matches_recompute::<Cuda>(&Default::default(), Dtype::BF16, 0.25);
    }
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use kiln::backends::Wgpu;
    use kiln::model::Dtype;

    use super::common::wgpu_device;

    #[test]
    fn f16_logits_match_transformers_in_f16() {
        super::logits_match::<Wgpu>(&wgpu_device(), Dtype::F16, 0.03);
    }

    #[test]
    fn f16_cache_matches_recompute() {
        super::cache_matches_recompute::<Wgpu>(&wgpu_device(), Dtype::F16, 0.03);
    }

    #[test]
    fn bf16_is_refused_with_a_reason() {
        let dir = super::common::fixture("hf/tied_gqa2");
        let err = kiln::model::hf::load_as::<Wgpu>(&dir, &wgpu_device(), Dtype::BF16).err().unwrap().to_string();
        assert!(err.contains("bf16") && err.contains("f16"), "{err}");
    }
}
