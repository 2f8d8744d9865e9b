//! `kiln init`: a randomly initialised HF model directory (Hugging Face's `_init_weights`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::Qwen2Config;

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The model's config.json.
    #[arg(long)]
    config: PathBuf,
    /// Output directory (must not exist or be empty).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tensor dtype written: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: SaveDtype,
    /// Directory whose tokenizer files are copied (default: the config's directory).
    #[arg(long)]
    tokenizer_from: Option<PathBuf>,
}

pub fn run(args: InitArgs) -> Result<()> {
    let config = Qwen2Config::from_file(&args.config)?;
    // (`--config` may name the model directory itself, as `from_file` reads it.)
    let config_dir = match args.config.parent() {
        _ if args.config.is_dir() => args.config.clone(),
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let companions = args.tokenizer_from.clone().unwrap_or(config_dir);
    // Tensor by tensor (the weights of `Qwen2::random`), so memory holds the saved bytes only.
    hf::save_random(&config, args.seed, &args.out, args.dtype, Some(&companions))
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({:.1}M parameters, seed {})",
        args.out.display(),
        config.num_parameters() as f64 / 1e6,
        args.seed
    );
    Ok(())
}
