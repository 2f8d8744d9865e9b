//! `kiln logprobs`: per-position next-token log-probs of a given sequence.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;
use kiln::backends::{DeviceSpec, Job};
use kiln::model::{Dtype, hf};
use kiln::model::logprobs::sequence_logprobs;
use kiln::tokenizer::Tokenizer;

#[derive(Debug, Args)]
pub struct LogprobsArgs {
    /// Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// The sequence as text.
    #[arg(long, group = "input")]
    text: Option<String>,
    /// --text gets the special tokens the tokenizer adds to a text (transformers'
    /// `tokenizer(text)`: a BOS for DeepSeek-R1-Distill's tokenizer, nothing for Qwen2.5's);
    /// `false` for text a chat template rendered already.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    add_special_tokens: bool,
    /// The sequence as token ids, e.g. 4,283,230.
    #[arg(long, group = "input")]
    ids: Option<String>,
    /// Device: cpu, wgpu[:N], cuda[:N].
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    /// Weights and activations in f32, bf16 or f16 (attention and log-probs in f32).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// Print `{"ids": [...], "logprobs": [null, ...]}`.
    #[arg(long)]
    json: bool,
}

pub fn run(args: LogprobsArgs) -> Result<()> {
    let backend = args.backend;
    kiln::backends::run(backend, LogprobsJob(args))?
}

struct LogprobsJob(LogprobsArgs);

impl Job for LogprobsJob {
    type Output = Result<()>;

    fn run<B: Backend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let (ids, input) = match (&args.text, &args.ids) {
            (Some(text), None) => {
                let tokenizer = Tokenizer::from_file(&args.model)?;
                let ids = match args.add_special_tokens {
                    true => tokenizer.encode_adding_special_tokens(text)?,
                    false => tokenizer.encode(text)?,
                };
                (ids, "--text")
            }
            (None, Some(ids)) => (super::parse_ids(ids)?, "--ids"),
            _ => bail!("give one of --text or --ids"),
        };
        let model = hf::load_as::<B>(&args.model, &device, args.dtype)?;
        let logprobs = sequence_logprobs(&model, std::slice::from_ref(&ids), 512).context(input)?.remove(0);
        // (JSON would write NaN as null, the value of the first position, and exit 0.)
        if let Some(t) = logprobs.iter().position(|lp| lp.is_some_and(|lp| !lp.is_finite())) {
            bail!("the log-prob at position {t} is not finite (--dtype {}): NaN or infinite weights, or activations that overflow this dtype", args.dtype);
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "ids": ids, "logprobs": logprobs }))?;
        } else {
            for (id, lp) in ids.iter().zip(&logprobs) {
                match lp {
                    Some(lp) => writeln!(out, "{id}\t{lp:.6}")?,
                    None => writeln!(out, "{id}\t-")?,
                }
            }
        }
        Ok(())
    }
}
