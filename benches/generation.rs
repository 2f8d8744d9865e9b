//! Criterion benches of the model forward (prefill) and of batched decoding on the CPU backend.
//!
//! `cargo bench --bench generation` runs a tiny config and the paper's ~100M config
//! (batch 8 × prompt 64; decoding 32 new tokens). `KILN_BENCH=tiny` keeps only the tiny one.
//! The `kiln bench` command prints the same figures as tokens/s for one configuration, next to
//! `benches/hf_generate_baseline.py` (transformers).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kiln::backends::Cpu;
use kiln::generate::{Engine, Sampler, SamplingParams};
use kiln::model::{HostBatch, Qwen2, Qwen2Config};

const TINY: &str = r#"{"vocab_size": 2200, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
    "max_position_embeddings": 512, "rope_theta": 1000000.0}"#;

fn configs() -> Vec<(&'static str, Qwen2Config)> {
    let mut out = vec![("tiny", serde_json::from_str(TINY).unwrap())];
    if std::env::var("KILN_BENCH").as_deref() != Ok("tiny") {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/interplay/qwen2_100M/config.json");
        out.push(("qwen2_100M", Qwen2Config::from_file(path).unwrap()));
    }
    out
}

fn prompts(batch: usize, len: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..batch).map(|b| (0..len).map(|t| ((b * 7919 + t * 104_729) as u32) % vocab).collect()).collect()
}

fn bench(c: &mut Criterion) {
    let (batch, prompt_len, new_tokens) = (8, 64, 32);
    for (name, config) in configs() {
        let device = Default::default();
        let model: Qwen2<Cpu> = Qwen2::random(&config, 0, &device).unwrap();
        let prompts = prompts(batch, prompt_len, config.vocab_size as u32);
        let mut group = c.benchmark_group(name);
        group.sample_size(10);

        group.throughput(Throughput::Elements((batch * prompt_len) as u64));
        let inputs = HostBatch::left_padded(&prompts, 0).unwrap().to_device::<Cpu>(&device);
        group.bench_function("prefill_8x64", |b| b.iter(|| model.forward_hidden(&inputs, None).into_data()));

        group.throughput(Throughput::Elements((batch * new_tokens) as u64));
        let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: new_tokens, ignore_eos: true, ..Default::default() };
        let engine = Engine::new(&model, None);
        group.bench_function("generate_8x64_to_32", |b| b.iter(|| engine.generate(&prompts, &params, |_| {}).unwrap()));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
