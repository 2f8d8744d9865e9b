//! Generation engine behaviour on a small random model with the paper's tokenizer: stop
//! strings (vLLM semantics), stop tokens / EOS, length limits, `n` samples and seeds.

mod common;

use common::fixture;
use kiln::backends::Cpu;
use kiln::generate::{Completion, Engine, FinishReason, Sampler, SamplingParams, StopCriteria, StopReason};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tokenizer::Tokenizer;

fn setup() -> (Qwen2<Cpu>, Tokenizer) {
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 128, "rope_theta": 10000.0, "initializer_range": 0.5}"#,
    )
    .unwrap();
    let model = Qwen2::random(&config, 42, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_file(fixture("interplay/qwen2_100M")).unwrap();
    (model, tokenizer)
}

fn prompt(tokenizer: &Tokenizer) -> Vec<u32> {
    tokenizer.encode("<question> The number of adult owl in Jefferson Circus equals 2. </question> <solution>").unwrap()
}

fn run(model: &Qwen2<Cpu>, tokenizer: &Tokenizer, prompts: &[Vec<u32>], params: &SamplingParams) -> Vec<Vec<Completion>> {
    Engine::new(model, Some(tokenizer)).generate(prompts, params, |_| {}).unwrap()
}

fn greedy(max_new_tokens: usize, stop: StopCriteria) -> SamplingParams {
    SamplingParams { sampler: Sampler::greedy(), max_new_tokens, stop, ..Default::default() }
}

#[test]
fn stop_strings_cut_the_text_like_vllm() {
    let (model, tokenizer) = setup();
    let prompts = [prompt(&tokenizer)];
    let free = run(&model, &tokenizer, &prompts, &greedy(40, StopCriteria::default())).remove(0).remove(0);
    assert_eq!((free.token_ids.len(), free.finish_reason), (40, FinishReason::Length));
    let full_text = tokenizer.decode(&free.token_ids, false).unwrap();
    assert_eq!(free.text, full_text);

    let stop = tokenizer.decode(&free.token_ids[10..12], false).unwrap();
    let cut = full_text.find(&stop).unwrap();
    // The first prefix of tokens whose text contains the stop string.
    let k = (1..=40).find(|&k| tokenizer.decode(&free.token_ids[..k], false).unwrap().contains(&stop)).unwrap();

    let stopped = run(&model, &tokenizer, &prompts, &greedy(40, StopCriteria { token_ids: vec![], strings: vec![stop.clone()], ..StopCriteria::default() }))
        .remove(0)
        .remove(0);
    assert_eq!(stopped.text, full_text[..cut]);
    assert_eq!(stopped.token_ids, free.token_ids[..k]);
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.stop_reason, Some(StopReason::String(stop)));
    assert_eq!(stopped.logprobs.len(), k);
}

#[test]
fn stop_tokens_end_the_sequence_and_leave_the_text() {
    let (model, tokenizer) = setup();
    let prompts = [prompt(&tokenizer)];
    let free = run(&model, &tokenizer, &prompts, &greedy(40, StopCriteria::default())).remove(0).remove(0);
    let eos = free.token_ids[7];
    let first = free.token_ids.iter().position(|&t| t == eos).unwrap();

    let out = run(&model, &tokenizer, &prompts, &greedy(40, StopCriteria { token_ids: vec![eos], strings: vec![], ..StopCriteria::default() }))
        .remove(0)
        .remove(0);
    assert_eq!(out.token_ids, free.token_ids[..=first], "the stop token is kept in the ids");
    // (The random model's tokens before it end inside a character here: left out, as vLLM does.)
    let before = tokenizer.decode(&free.token_ids[..first], false).unwrap();
    assert_eq!(out.text, before.trim_end_matches('\u{FFFD}'), "but not in the text");
    assert_eq!((out.finish_reason, out.stop_reason), (FinishReason::Stop, Some(StopReason::Token(eos))));
}

#[test]
fn length_limits_and_empty_generations() {
    let (model, tokenizer) = setup();
    let prompts = [prompt(&tokenizer)];
    let none = run(&model, &tokenizer, &prompts, &greedy(0, StopCriteria::default())).remove(0).remove(0);
    assert!(none.token_ids.is_empty() && none.text.is_empty());
    assert_eq!(none.finish_reason, FinishReason::Length);

    // The context (128 positions) caps generation.
    let near_full: Vec<u32> = prompts[0].iter().cycle().take(120).copied().collect();
    let capped = run(&model, &tokenizer, &[near_full], &greedy(50, StopCriteria::default())).remove(0).remove(0);
    assert_eq!((capped.token_ids.len(), capped.finish_reason), (8, FinishReason::Length));

    let too_long: Vec<u32> = prompts[0].iter().cycle().take(128).copied().collect();
    let err = Engine::new(&model, Some(&tokenizer)).generate(&[too_long], &greedy(5, StopCriteria::default()), |_| {});
    assert!(err.unwrap_err().to_string().contains("has 128 tokens; the model's context is 128"));
}

#[test]
fn n_samples_are_seeded_and_reproducible() {
    let (model, tokenizer) = setup();
    let prompts = [prompt(&tokenizer), tokenizer.encode("<question> How many").unwrap()];
    let params = |seed| SamplingParams {
        n: 4,
        sampler: Sampler { temperature: 1.0, top_k: 50, top_p: 0.95, min_p: 0.0 },
        max_new_tokens: 12,
        seed,
        ..Default::default()
    };
    let a = run(&model, &tokenizer, &prompts, &params(1));
    let b = run(&model, &tokenizer, &prompts, &params(1));
    let c = run(&model, &tokenizer, &prompts, &params(2));
    let ids = |r: &Vec<Vec<Completion>>| -> Vec<Vec<u32>> { r.iter().flatten().map(|s| s.token_ids.clone()).collect() };
    assert_eq!(a.len(), 2);
    assert!(a.iter().all(|s| s.len() == 4));
    assert_eq!(ids(&a), ids(&b), "same seed, same samples");
    assert_ne!(ids(&a), ids(&c), "another seed, other samples");
    let first = &a[0];
    assert!(first.iter().any(|s| s.token_ids != first[0].token_ids), "samples of one prompt differ");
    for sample in a.iter().flatten() {
        assert!(sample.logprobs.iter().zip(&sample.raw_logprobs).all(|(lp, raw)| *lp <= 0.0 && *raw <= 0.0));
    }
}

/// A model loaded from a directory stops at its EOS ids by default: `eos_token_id` of
/// `generation_config.json` (here a list) and of `config.json`. `ignore_eos` runs to the limit.
#[test]
fn generation_stops_at_the_models_eos_by_default() {
    use kiln::generate::model_eos_ids;
    use kiln::model::hf::{self, SaveDtype};

    let (model, tokenizer) = setup();
    let prompts = [prompt(&tokenizer)];
    let free = run(&model, &tokenizer, &prompts, &greedy(40, StopCriteria::default())).remove(0).remove(0);
    assert_eq!(free.token_ids.len(), 40, "the random model's config names no EOS");
    let (early, late) = (free.token_ids[4], free.token_ids[9]);
    let first = |t: u32| free.token_ids.iter().position(|&x| x == t).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    hf::save(&model, &dir, SaveDtype::F32, None).unwrap();
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    config["eos_token_id"] = late.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    // config.json alone.
    let loaded = hf::load::<Cpu>(&dir, &Default::default()).unwrap();
    assert_eq!(loaded.eos_token_ids(), [late]);
    let out = Engine::new(&loaded, None).generate(&prompts, &greedy(40, StopCriteria::default()), |_| {}).unwrap();
    assert_eq!(out[0][0].token_ids, free.token_ids[..=first(late)]);
    assert_eq!((out[0][0].finish_reason, out[0][0].stop_reason.clone()), (FinishReason::Stop, Some(StopReason::Token(late))));

    // generation_config.json adds its list.
    std::fs::write(dir.join("generation_config.json"), format!(r#"{{"eos_token_id": [{early}, 7]}}"#)).unwrap();
    let loaded = hf::load::<Cpu>(&dir, &Default::default()).unwrap();
    let mut expected = vec![early, late, 7];
    expected.sort_unstable();
    assert_eq!(loaded.eos_token_ids(), expected);
    let engine = Engine::new(&loaded, Some(&tokenizer));
    let config = loaded.config().clone();
    assert_eq!(engine.eos_ids, model_eos_ids(&dir, &config, Some(&tokenizer)).unwrap(), "the engine stops where `kiln generate` did");
    let out = engine.generate(&prompts, &greedy(40, StopCriteria::default()), |_| {}).unwrap();
    assert_eq!(out[0][0].token_ids, free.token_ids[..=first(early).min(first(late))]);

    let ignoring = SamplingParams { ignore_eos: true, ..greedy(40, StopCriteria::default()) };
    let out = engine.generate(&prompts, &ignoring, |_| {}).unwrap();
    assert_eq!(out[0][0].token_ids, free.token_ids, "ignore_eos runs to the length limit");
    let stop_late = SamplingParams { ignore_eos: true, ..greedy(40, StopCriteria { token_ids: vec![late], strings: vec![], ..StopCriteria::default() }) };
    let out = engine.generate(&prompts, &stop_late, |_| {}).unwrap();
    assert_eq!(out[0][0].token_ids, free.token_ids[..=first(late)], "explicit stop ids still apply");
}

/// Continuous batching: with room for 2 rows, prompts whose length limits differ (the context
/// is 128 tokens) decode in one pass of the longest (a finished row's place goes to the next
/// prompt), and every sample is the one it is when all decode together.
#[test]
fn finished_rows_are_replaced_by_waiting_prompts() {
    let (model, tokenizer) = setup();
    // Limits min(40, 128 - len): 40, 20, 10, 5, 4 new tokens.
    let prompts: Vec<Vec<u32>> = [4usize, 108, 118, 123, 124].iter().map(|&len| (0..len).map(|t| (t * 37 % 2000 + 10) as u32).collect()).collect();
    let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 40, ignore_eos: true, ..Default::default() };
    let together = run(&model, &tokenizer, &prompts, &params);
    let mut engine = Engine::new(&model, Some(&tokenizer));
    engine.max_batch_size = 2;
    let (mut steps, mut last) = (0, 0);
    let paired = engine
        .generate(&prompts, &params, |p| {
            assert!(p.tokens - last <= 2, "more rows than the batch holds");
            (steps, last) = (steps + 1, p.tokens);
        })
        .unwrap();
    let lengths: Vec<usize> = paired.iter().map(|c| c[0].token_ids.len()).collect();
    assert_eq!(lengths, [40, 20, 10, 5, 4]);
    // Static batches of 2 would take 40 + 10 + 4 steps.
    assert_eq!(steps, 40, "the long row decodes while the short ones take turns beside it");
    for (a, b) in together.iter().zip(&paired) {
        assert_eq!(a[0].token_ids, b[0].token_ids);
    }
}

/// A tokenizer whose pad token lies outside the model's vocabulary (a `[PAD]` added without
/// resizing the model): prompts of different lengths still generate together, each as it does
/// alone (the padding never reaches a result; it panicked in the embedding lookup).
#[test]
fn a_pad_token_outside_the_vocabulary_still_pads() {
    let (model, paper) = setup();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("interplay/qwen2_100M").join("tokenizer.json"), tmp.path().join("tokenizer.json")).unwrap();
    // `<special_token_4>` is id 2200, one past the model's vocabulary.
    std::fs::write(tmp.path().join("tokenizer_config.json"), r#"{"pad_token": "<special_token_4>"}"#).unwrap();
    let tokenizer = Tokenizer::from_file(tmp.path()).unwrap();
    assert_eq!(tokenizer.pad_id(), Some(2200));
    let prompts = vec![prompt(&paper), vec![12, 13, 14]];
    let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 12, ignore_eos: true, ..Default::default() };
    let together = run(&model, &tokenizer, &prompts, &params);
    for (i, p) in prompts.iter().enumerate() {
        let alone = run(&model, &tokenizer, std::slice::from_ref(p), &params);
        assert_eq!(alone[0][0].token_ids, together[i][0].token_ids, "prompt {i}");
    }
}

/// Same seed, same samples on the CPU (host sampling, f64) and on wgpu (sampling on the device,
/// `generate::device_sampler`): temperature 1, top-p 0.9, n = 4, and on wgpu the same samples
/// again with another batch size (rows join and leave the batch at other steps).
#[cfg(feature = "wgpu")]
#[test]
fn same_seed_same_samples_on_the_cpu_and_wgpu() {
    use kiln::backends::Wgpu;
    let (cpu_model, tokenizer) = setup();
    let device = common::wgpu_device();
    let config = cpu_model.config().clone();
    let gpu_model: Qwen2<Wgpu> = Qwen2::random(&config, 42, &device).unwrap();
    let prompts = [prompt(&tokenizer), tokenizer.encode("<question> How many").unwrap(), tokenizer.encode("<solution> Define").unwrap()];
    let params = SamplingParams {
        n: 4,
        sampler: Sampler { temperature: 1.0, top_p: 0.9, ..Sampler::default() },
        max_new_tokens: 16,
        seed: 7,
        ignore_eos: true,
        ..Default::default()
    };
    let cpu = run(&cpu_model, &tokenizer, &prompts, &params);
    let mut engine = Engine::new(&gpu_model, Some(&tokenizer));
    let gpu = engine.generate(&prompts, &params, |_| {}).unwrap();
    engine.max_batch_size = 5;
    let gpu_small_batches = engine.generate(&prompts, &params, |_| {}).unwrap();
    let ids = |r: &Vec<Vec<Completion>>| -> Vec<Vec<u32>> { r.iter().flatten().map(|s| s.token_ids.clone()).collect() };
    assert_eq!(ids(&cpu), ids(&gpu), "the CPU's and wgpu's samples");
    assert_eq!(ids(&gpu), ids(&gpu_small_batches), "wgpu's samples at batch 64 and 5");
    let distinct: std::collections::HashSet<_> = ids(&cpu).into_iter().collect();
    assert!(distinct.len() > 8, "samples differ from one another: {distinct:?}");
    for (c, g) in cpu.iter().flatten().zip(gpu.iter().flatten()) {
        for (a, b) in c.logprobs.iter().zip(&g.logprobs).chain(c.raw_logprobs.iter().zip(&g.raw_logprobs)) {
            assert!((a - b).abs() < 1e-3, "log-probs {:?} vs {:?}", c.logprobs, g.logprobs);
        }
    }

    // vLLM's penalties, and min_tokens keeping the most sampled token (made a stop id) out of
    // the first 6: edited on the device as on the host.
    let mut counts = std::collections::HashMap::new();
    ids(&cpu).iter().flatten().for_each(|&t| *counts.entry(t).or_insert(0) += 1);
    let frequent = counts.into_iter().max_by_key(|&(t, c)| (c, t)).unwrap().0;
    let edited = SamplingParams {
        penalties: kiln::generate::Penalties { repetition: 1.3, presence: 0.5, frequency: 0.4 },
        stop: StopCriteria { token_ids: vec![frequent], min_tokens: 6, ..StopCriteria::default() },
        ..params.clone()
    };
    let (cpu_edited, gpu_edited) = (run(&cpu_model, &tokenizer, &prompts, &edited), engine.generate(&prompts, &edited, |_| {}).unwrap());
    assert_eq!(ids(&cpu_edited), ids(&gpu_edited), "the CPU's and wgpu's samples, edited");
    assert_ne!(ids(&cpu_edited), ids(&cpu), "the edits changed the samples");
    assert!(ids(&cpu_edited).iter().all(|s| s.len() > 6 && !s[..6].contains(&frequent)), "{:?}", ids(&cpu_edited));
}
