//! `kiln generate`: batched sampling from a Hugging Face model directory.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::backend::Backend;
use clap::Args;
use kiln::backends::{DeviceSpec, Job};
use kiln::generate::{Engine, Penalties, Sampler, SamplingParams, StopCriteria};
use kiln::model::logprobs::sequence_logprobs;
use kiln::model::{Dtype, hf};
use kiln::tokenizer::Tokenizer;
use serde::Deserialize;

use super::progress;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Hugging Face model directory (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// One prompt as text.
    #[arg(long, group = "input")]
    prompt: Option<String>,
    /// One prompt as token ids, e.g. 4,283,230.
    #[arg(long, group = "input")]
    prompt_ids: Option<String>,
    /// JSONL file, one `{"prompt": text}` or `{"prompt_ids": [ids]}` per line.
    #[arg(long, group = "input")]
    prompts: Option<PathBuf>,
    /// Text prompts get the special tokens the tokenizer adds to a text (vLLM's and
    /// transformers' default: a BOS for DeepSeek-R1-Distill's tokenizer, nothing for
    /// Qwen2.5's); `false` for text a chat template rendered already.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    add_special_tokens: bool,
    /// Device: cpu, wgpu[:N], cuda[:N].
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    /// Weights and activations in f32, bf16 or f16 (attention and log-probs in f32).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// Samples per prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Sampling temperature; 0 (anything under 1e-5) is greedy (vLLM raises one in (0, 0.01) to
    /// 0.01 and samples).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Nucleus sampling mass (1 disables).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0, or vLLM's -1, disables).
    #[arg(long, default_value_t = 0, value_parser = super::parse_top_k, allow_negative_numbers = true)]
    top_k: usize,
    /// Keep only tokens at least this fraction as likely as the most likely one (0 disables).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// vLLM's: a token in the prompt or the output has a positive logit divided by this, a
    /// negative one multiplied (1 disables).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// vLLM's: subtracted from the logit of every token the output holds, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// vLLM's: subtracted once per time the output holds a token, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// No sample stops before this many tokens: until then its EOS and stop tokens are not
    /// sampled and stop strings do not count (vLLM's `min_tokens`).
    #[arg(long, default_value_t = 0)]
    min_tokens: usize,
    /// Stop string (repeatable); excluded from the returned text.
    #[arg(long)]
    stop: Vec<String>,
    /// The returned text keeps the stop string, or the stop token's text (vLLM's
    /// `include_stop_str_in_output`).
    #[arg(long)]
    include_stop_str_in_output: bool,
    /// Extra stop token ids, e.g. 9,3.
    #[arg(long)]
    stop_token_ids: Option<String>,
    /// Sampling seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Do not stop at the model's EOS tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Drop special tokens from the returned text (vLLM's default; kiln keeps them unless
    /// this is given).
    #[arg(long)]
    skip_special_tokens: bool,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// GiB of KV cache. A paged cache (the CPU in f32, wgpu, CUDA) takes in a sample while the
    /// 64-position blocks it may need at its longest fit (a prompt's blocks counted once for all
    /// its samples; default: half the memory available: the host's, a CUDA device's; on wgpu
    /// only its largest buffer bounds it); the
    /// batch-shaped cache decodes at most as many sequences as fit at the longest prompt plus
    /// --max-new-tokens. Either way at most
    /// --batch-size together (and --prompt-logprobs scores as many rows as fit).
    #[arg(long)]
    kv_memory: Option<f64>,
    /// The most tokens (padding included) one prefill pass takes: the prompts joining the batch
    /// are prefilled in groups within it (vLLM's --max-num-batched-tokens bounds its steps the
    /// same way), as --prompt-logprobs scores the prompts
    #[arg(long, default_value_t = kiln::generate::MAX_PREFILL_TOKENS, value_parser = super::positive)]
    max_prefill_tokens: usize,
    /// Print one JSON object per sample.
    #[arg(long)]
    json: bool,
    /// With --json: each sample also gives `prompt_logprobs`, the log-prob of every prompt
    /// token given the ones before it (`null` for the first), as vLLM's `prompt_logprobs=0`.
    #[arg(long, requires = "json")]
    prompt_logprobs: bool,
}

/// One line of a `--prompts` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    prompt: Option<String>,
    prompt_ids: Option<Vec<u32>>,
}

enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// The prompts of a `--prompts` file, each with its place ("FILE line N").
fn read_prompts(path: &Path) -> Result<Vec<(Prompt, String)>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut prompts = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let parsed: PromptLine = serde_json::from_str(&line).with_context(at)?;
        prompts.push(match parsed {
            PromptLine { prompt: Some(text), prompt_ids: None } => (Prompt::Text(text), at()),
            PromptLine { prompt: None, prompt_ids: Some(ids) } => (Prompt::Ids(ids), at()),
            _ => bail!("{}: expected exactly one of \"prompt\" or \"prompt_ids\"", at()),
        });
    }
    if prompts.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(prompts)
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let backend = args.backend;
    kiln::backends::run(backend, GenerateJob(args))?
}

struct GenerateJob(GenerateArgs);

impl Job for GenerateJob {
    type Output = Result<()>;

    fn run<B: Backend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let (prompts, places): (Vec<Prompt>, Vec<String>) = match (&args.prompt, &args.prompt_ids, &args.prompts) {
            (Some(text), None, None) => (vec![Prompt::Text(text.clone())], vec!["--prompt".into()]),
            (None, Some(ids), None) => (vec![Prompt::Ids(super::parse_ids(ids)?)], vec!["--prompt-ids".into()]),
            (None, None, Some(path)) => read_prompts(path)?.into_iter().unzip(),
            _ => bail!("give one of --prompt, --prompt-ids or --prompts"),
        };
        if args.stop.iter().any(String::is_empty) {
            bail!("--stop cannot be an empty string (vLLM refuses it too: every sample would stop at its first token)");
        }
        // A model directory without tokenizer.json decodes ids alone; a broken tokenizer is an
        // error (its EOS ids and texts would be silently missing).
        let needs_tokenizer = !args.stop.is_empty() || prompts.iter().any(|p| matches!(p, Prompt::Text(_)));
        let tokenizer = match needs_tokenizer || args.model.join("tokenizer.json").exists() {
            true => Some(Tokenizer::from_file(&args.model)?),
            false => None,
        };
        let prompt_ids: Vec<Vec<u32>> = prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Text(text) => {
                    let tokenizer = tokenizer.as_ref().expect("checked above");
                    match args.add_special_tokens {
                        true => tokenizer.encode_adding_special_tokens(&text),
                        false => tokenizer.encode(&text),
                    }
                }
                Prompt::Ids(ids) => Ok(ids),
            })
            .collect::<Result<_, _>>()?;

        let model = hf::load_as::<B>(&args.model, &device, args.dtype)?;
        for (ids, place) in prompt_ids.iter().zip(&places) {
            kiln::generate::check_prompt(&model, ids).map_err(|e| anyhow!("{place}: the prompt {e}"))?;
        }
        let token_ids = match &args.stop_token_ids {
            Some(ids) => super::parse_ids(ids)?,
            None => Vec::new(),
        };
        let seed = args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        let params = SamplingParams {
            n: args.n,
            sampler: Sampler { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p },
            max_new_tokens: args.max_new_tokens,
            stop: StopCriteria { token_ids, strings: args.stop.clone(), include_in_output: args.include_stop_str_in_output, min_tokens: args.min_tokens },
            ignore_eos: args.ignore_eos,
            seed,
            skip_special_tokens: args.skip_special_tokens,
            penalties: Penalties { repetition: args.repetition_penalty, presence: args.presence_penalty, frequency: args.frequency_penalty },
        };
        let mut engine = Engine::new(&model, tokenizer.as_ref());
        engine.max_batch_size = args.batch_size.max(1);
        engine.kv_memory = args.kv_memory.map(kiln::generate::gib_bytes);
        engine.max_prefill_tokens = args.max_prefill_tokens;

        let prompt_logprobs = match args.prompt_logprobs {
            true => {
                let longest = prompt_ids.iter().map(Vec::len).max().unwrap_or(0).saturating_add(args.max_new_tokens);
                let rows = match engine.kv_memory {
                    Some(bytes) => engine.max_batch_size.min(engine.rows_within(bytes, longest.min(model.context_len()))?),
                    None => engine.max_batch_size,
                };
                Some(prompts_logprobs(&model, &prompt_ids, rows, args.max_prefill_tokens)?)
            }
            false => None,
        };
        let bar = progress::with_eta(prompt_ids.len().saturating_mul(args.n) as u64, "samples");
        let results = engine.generate(&prompt_ids, &params, |p| {
            bar.set_position(p.finished as u64);
            bar.set_message(format!("{} tokens", p.tokens));
        })?;
        bar.finish_and_clear();

        if args.backend != kiln::backends::DeviceSpec::Cpu {
            eprintln!("{}", autotune_line());
        }
        let mut out = std::io::stdout().lock();
        for (prompt_index, samples) in results.iter().enumerate() {
            for sample in samples {
                if args.json {
                    let mut line = serde_json::to_value(sample)?;
                    if let (Some(all), Some(fields)) = (&prompt_logprobs, line.as_object_mut()) {
                        fields.insert("prompt_logprobs".into(), serde_json::json!(all[prompt_index]));
                    }
                    writeln!(out, "{line}")?;
                } else {
                    if results.len() > 1 || args.n > 1 {
                        let finish = serde_json::to_value(sample.finish_reason)?;
                        writeln!(out, "--- prompt {prompt_index} sample {} ({})", sample.sample_index, finish.as_str().unwrap_or_default())?;
                    }
                    writeln!(out, "{}", sample.text)?;
                }
            }
        }
        Ok(())
    }
}

/// The log-probs of every prompt's tokens, at most `rows` prompts and `max_tokens` tokens
/// (padding included; a longer prompt alone) in each forward pass, as the engine's prefill
/// passes; the LM head over as many positions at once as keep its f32 logits near 64 MiB.
fn prompts_logprobs<B: Backend>(model: &kiln::model::Qwen2<B>, prompts: &[Vec<u32>], rows: usize, max_tokens: usize) -> Result<Vec<Vec<Option<f32>>>> {
    let mut all = Vec::with_capacity(prompts.len());
    let mut rest = prompts;
    let bar = progress::with_eta(prompts.len() as u64, "prompts");
    bar.set_message("--prompt-logprobs".to_owned());
    while !rest.is_empty() {
        let take = kiln::generate::prefill_group(rest.iter().map(Vec::len), max_tokens).min(rows.max(1));
        let (group, after) = rest.split_at(take);
        rest = after;
        let positions = ((64usize << 20) / (4 * group.len() * model.config().vocab_size.max(1))).clamp(1, 512);
        all.extend(sequence_logprobs(model, group, positions).context("--prompt-logprobs")?);
        bar.set_position(all.len() as u64);
    }
    bar.finish_and_clear();
    Ok(all)
}

/// The kernels burn's autotune chose on this machine so far (cubecl's cache), one stderr line:
/// per tuned operation, each kernel and how many shapes it won.
fn autotune_line() -> String {
    let choices = kiln::backends::device::autotune_choices();
    let ops: Vec<String> = choices
        .iter()
        .map(|(op, kernels)| {
            let kernels: Vec<String> = kernels.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            format!("{op}: {}", kernels.join(", "))
        })
        .collect();
    match ops.is_empty() {
        true => "autotune: nothing tuned yet".into(),
        false => format!("autotune (kernel ×shapes won): {}", ops.join("; ")),
    }
}
