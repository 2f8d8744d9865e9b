//! `kiln config import --from trl`: TRL's `GRPOConfig` (→ `kiln rl`) or `SFTConfig` (→ `kiln
//! sft`) fields, from a YAML or JSON file, with `key=value` overrides. A key the file leaves out
//! takes TRL 1.16.0's default ([`TRL_DEFAULTS`]), not kiln's. The model and data come from TRL
//! CLI's `model_name_or_path` and `dataset_name` (in the file or as overrides).
//!
//! Keys are carried ([`MAPPING`]), refused when their value changes the training and kiln has
//! no equivalent, ignored (listed) when they do not matter to kiln, or listed as unknown.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

use super::tree::{self, Override};
use super::{ImportReport, Imported, Refusals, RunKind, Source, finish};
use crate::error::{Error, Result};

/// TRL key → kiln key.
pub const MAPPING: &[(&str, &str)] = &[
    ("model_name_or_path", "[model] from"),
    ("dataset_name", "[data] files (rl) / path (sft)"),
    ("output_dir", "[output] dir"),
    ("learning_rate", "[optimizer] lr"),
    ("weight_decay", "[optimizer] weight_decay"),
    ("adam_beta1, adam_beta2, adam_epsilon", "[optimizer] beta1, beta2, eps"),
    ("max_grad_norm", "[optimizer] max_grad_norm"),
    ("gradient_checkpointing (true)", "[train] recompute (per-layer checkpointing, the same gradients)"),
    ("lr_scheduler_type (+ lr_scheduler_kwargs min_lr / min_lr_rate)", "[schedule] kind (min_lr, min_lr_rate)"),
    ("warmup_ratio, warmup_steps", "[schedule] warmup_ratio, warmup_steps"),
    ("num_train_epochs", "[train] epochs"),
    ("max_steps (> 0)", "[train] steps"),
    ("save_steps (save_strategy = \"no\" -> 0, \"epoch\" -> 1 / num_train_epochs)", "[output] save_steps"),
    ("seed", "[data] seed (rl) / [train] seed (sft)"),
    ("per_device_train_batch_size", "[train] micro_batch"),
    ("gradient_accumulation_steps", "[train] grad_accum (sft); rl: mini_batch = per_device_train_batch_size x gradient_accumulation_steps / num_generations"),
    ("generation_batch_size / steps_per_generation", "[train] prompts_per_step = generation batch / num_generations"),
    ("num_generations", "[rollout] n"),
    ("max_completion_length", "[rollout] max_response_length"),
    ("max_prompt_length (TRL < 1.0)", "[data] max_prompt_length"),
    ("temperature, top_p, top_k, min_p", "[rollout] temperature, top_p, top_k, min_p"),
    ("beta", "[loss] kl_coef (kl_estimator = \"k3\")"),
    ("epsilon", "[loss] clip_ratio (TRL's clip range; kiln's [loss] epsilon is the std's)"),
    ("epsilon_high", "[loss] clip_ratio_high"),
    ("delta", "[loss] clip_ratio_c (absent: 1e9, no dual clip)"),
    ("loss_type", "[loss] agg: grpo -> seq-mean-token-mean, bnpo/dapo -> token-mean, dr_grpo -> seq-mean-token-sum-norm-dr; cispo -> policy_loss cispo"),
    ("scale_rewards", "group -> [loss] reward_scaling = group, batch -> batch, none/false -> adv_estimator = dr_grpo"),
    ("importance_sampling_level", "token -> policy_loss vanilla, sequence -> gspo"),
    ("use_vllm + vllm_importance_sampling_correction (mode token_truncate), vllm_importance_sampling_clip_max", "[loss] tis_imp_ratio_cap"),
    ("max_length (sft)", "[data] max_length"),
    ("packing (packing_strategy bfd)", "[data] neat_packing, cutoff_len = max_length; [train] padding_free"),
    ("padding_free (sft)", "[train] padding_free"),
    ("chat_template_path (sft)", "[data] chat_template"),
    ("eos_token (sft)", "[data] eos_token"),
];

/// TRL 1.16.0's defaults (`GRPOConfig`, `SFTConfig`, transformers' `TrainingArguments`) of the
/// keys kiln carries.
pub const TRL_DEFAULTS: &[(&str, &str)] = &[
    ("output_dir", "\"trainer_output\""),
    ("weight_decay", "0.0"),
    ("adam_beta1", "0.9"),
    ("adam_beta2", "0.999"),
    ("adam_epsilon", "1e-8"),
    ("max_grad_norm", "1.0"),
    ("lr_scheduler_type", "\"linear\""),
    ("warmup_ratio", "0.0"),
    ("warmup_steps", "0"),
    ("num_train_epochs", "3.0"),
    ("max_steps", "-1"),
    ("save_steps", "500"),
    ("save_strategy", "\"steps\""),
    ("seed", "42"),
    ("per_device_train_batch_size", "8"),
    ("gradient_accumulation_steps", "1"),
    ("optim", "\"adamw_torch\""),
    // GRPOConfig
    ("num_generations", "8"),
    ("max_completion_length", "512"),
    ("temperature", "1.0"),
    ("top_p", "1.0"),
    ("top_k", "0"),
    ("beta", "0.0"),
    ("num_iterations", "1"),
    ("epsilon", "0.2"),
    ("loss_type", "\"dapo\""),
    ("scale_rewards", "\"group\""),
    ("importance_sampling_level", "\"token\""),
    ("use_vllm", "false"),
    ("vllm_importance_sampling_correction", "true"),
    ("vllm_importance_sampling_mode", "\"sequence_mask\""),
    ("vllm_importance_sampling_clip_max", "3.0"),
    ("repetition_penalty", "1.0"),
    ("mask_truncated_completions", "false"),
    ("sync_ref_model", "false"),
    ("top_entropy_quantile", "1.0"),
    ("entropy_coef", "0.0"),
    ("use_adaptive_entropy", "false"),
    // SFTConfig
    ("max_length", "1024"),
    ("packing", "false"),
    ("packing_strategy", "\"bfd\""),
    ("padding_free", "false"),
    ("assistant_only_loss", "false"),
];

/// GRPO keys: a file with any of them is a GRPOConfig (`loss_type` is in both).
const GRPO_KEYS: &[&str] = &["num_generations", "beta", "epsilon", "epsilon_high", "max_completion_length", "scale_rewards", "temperature", "importance_sampling_level", "num_iterations", "generation_batch_size", "steps_per_generation", "delta"];
/// SFT keys.
const SFT_KEYS: &[&str] = &["max_length", "packing", "completion_only_loss", "assistant_only_loss", "dataset_text_field", "packing_strategy", "padding_free", "chat_template_path", "eos_token"];

/// Keys whose values change the training and that kiln runs only at these values.
const REFUSED: &Refusals = &[
    ("num_iterations", &["1"], "kiln makes one pass over a step's completions"),
    ("repetition_penalty", &["1", "1.0"], "kiln's sampler has no repetition penalty"),
    ("mask_truncated_completions", &["false"], "kiln trains on truncated completions"),
    ("sync_ref_model", &["false"], "kiln's reference is the initial policy"),
    ("top_entropy_quantile", &["1", "1.0"], "kiln trains on every token"),
    ("entropy_coef", &["0", "0.0"], "kiln has no entropy bonus"),
    ("use_adaptive_entropy", &["false"], "kiln has no entropy bonus"),
    ("off_policy_mask_threshold", &["null"], "kiln has no off-policy sequence masking"),
    ("generation_kwargs", &["null"], "kiln's sampler takes temperature, top_p, top_k and min_p only"),
    ("assistant_only_loss", &["false"], "kiln's SFT loss is on the completion"),
    ("completion_only_loss", &["null", "true"], "kiln's SFT loss is on the completion only"),
    ("use_liger_loss", &["null", "false"], "kiln computes its own loss"),
];

/// Keys that do not matter to kiln (infrastructure, logging, data loading).
const IRRELEVANT: &[&str] = &[
    "logging_steps", "logging_strategy", "logging_first_step", "logging_dir", "report_to", "run_name", "bf16", "fp16", "tf32",
    "gradient_checkpointing_kwargs", "push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo",
    "save_total_limit", "save_only_model", "save_safetensors", "log_completions", "num_completions_to_print", "log_unique_prompts",
    "log_multimodal", "log_completions_hub_repo", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_drop_last",
    "ddp_find_unused_parameters", "ddp_timeout", "deepspeed", "fsdp", "fsdp_config", "torch_compile", "per_device_eval_batch_size",
    "ds3_gather_for_generation", "cast_lm_head_to_fp32", "disable_dropout", "shuffle_dataset", "remove_unused_columns",
    "pad_to_multiple_of", "model_init_kwargs", "trust_remote_code", "cache_implementation", "chat_template_kwargs", "reward_weights",
    "multi_objective_aggregation", "use_liger_kernel", "overwrite_output_dir", "do_train", "do_eval", "resume_from_checkpoint",
    "dataset_num_proc", "num_generations_eval", "router_aux_loss_coef", "use_bias_correction_kl", "max_tool_calling_iterations",
    "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged", "eval_strategy",
    "eval_steps", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_text_field", "eval_packing",
    "dataset_kwargs", "pad_token", "activation_offloading", "torch_dtype",
    "dtype", "attn_implementation", "use_peft", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_server_base_url",
    "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port", "vllm_gpu_memory_utilization",
    "vllm_max_model_length", "vllm_tensor_parallel_size", "vllm_structured_outputs_regex", "sapo_temperature_neg",
    "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "ref_model_mixup_alpha",
    "ref_model_sync_steps", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
    "vllm_importance_sampling_clip_min", "truncation_mode",
];

struct Ctx<'a> {
    path: &'a Path,
    tree: Value,
    used: BTreeSet<String>,
    report: ImportReport,
    out: Value,
}

impl Source for Ctx<'_> {
    fn path(&self) -> &Path {
        self.path
    }

    /// The file's value of `key`, else TRL's default (null if none).
    fn get(&mut self, key: &str) -> Value {
        self.used.insert(key.to_owned());
        match self.tree.get(key) {
            Some(v) => v.clone(),
            None => TRL_DEFAULTS.iter().find(|(k, _)| *k == key).map(|(_, d)| serde_json::from_str(d).expect("valid defaults")).unwrap_or(Value::Null),
        }
    }
}

impl Ctx<'_> {
    fn carry(&mut self, from: &str, to: &str, value: impl Into<Value>) {
        let value = value.into();
        let origin = if self.tree.get(from.split(' ').next().unwrap_or(from)).is_some() { "" } else { " (TRL's default)" };
        self.report.carried.push((format!("{from}{origin}"), format!("{to} = {value}")));
        tree::set(&mut self.out, to, value).expect("kiln keys are tables");
    }
}

/// Imports the TRL config `text` (the file at `path`) with `overrides`, as `kind` (rl or sft;
/// detected from GRPO- or SFT-only keys when `None`).
pub fn import(path: &Path, text: &str, overrides: &[String], kind: Option<RunKind>) -> Result<Imported> {
    let mut root = tree::parse_file(path, text)?;
    for text in overrides {
        let mut o = Override::parse(text).map_err(|e| Error::config(path, e))?;
        if o.mode == tree::OverrideMode::Set {
            o.mode = tree::OverrideMode::Force;
        }
        o.apply(&mut root).map_err(|e| Error::config(path, e))?;
    }
    if let Some((key, _)) = root.as_object().and_then(|m| m.iter().find(|(_, v)| v.is_object() && !matches!(v, Value::Object(m) if m.is_empty()))).filter(|(k, _)| !["model_init_kwargs", "lr_scheduler_kwargs", "generation_kwargs", "chat_template_kwargs", "gradient_checkpointing_kwargs", "dataset_kwargs", "fsdp_config"].contains(&k.as_str())) {
        return Err(Error::config(path, format!("{key}: TRL configs are flat (GRPOConfig / SFTConfig fields); is this a verl config (--from verl)?")));
    }
    let has = |keys: &[&str]| keys.iter().any(|k| root.get(*k).is_some());
    let kind = match kind {
        Some(kind @ (RunKind::Rl | RunKind::Sft)) => kind,
        Some(other) => return Err(Error::config(path, format!("TRL configs import as rl (GRPOConfig) or sft (SFTConfig), not {}", other.name()))),
        None if has(GRPO_KEYS) => RunKind::Rl,
        None if has(SFT_KEYS) => RunKind::Sft,
        None => return Err(Error::config(path, "cannot tell a GRPOConfig from an SFTConfig: give --kind rl or --kind sft")),
    };
    let grpo = kind == RunKind::Rl;
    let mut c = Ctx { path, tree: root, used: BTreeSet::new(), report: ImportReport::default(), out: json!({}) };

    c.check_refused(REFUSED)?;
    let optim = c.text("optim").unwrap_or_default();
    if !optim.starts_with("adamw") {
        return Err(c.refuse("optim", &Value::from(optim), "kiln's optimizer is AdamW"));
    }

    let from = c.text("model_name_or_path").ok_or_else(|| Error::config(path, "model_name_or_path is required ([model] from): give it in the file or as model_name_or_path=DIR"))?;
    c.carry("model_name_or_path", "model.from", from);
    let dataset = c.text("dataset_name").ok_or_else(|| Error::config(path, "dataset_name is required ([data]): give it in the file or as dataset_name=FILE"))?;
    if grpo {
        tree::set(&mut c.out, "data.kind", Value::from("prompts")).expect("a table");
        c.carry("dataset_name", "data.files", json!([dataset]));
        c.report.notes.push("[data] files is TRL's dataset_name as written: kiln reads its task's JSONL rows there".into());
    } else {
        tree::set(&mut c.out, "data.kind", Value::from("sft")).expect("a table");
        c.carry("dataset_name", "data.path", dataset);
    }
    let dir = c.text("output_dir").unwrap_or_default();
    c.carry("output_dir", "output.dir", dir);

    // [optimizer]
    let lr_default = if grpo { 1e-6 } else { 2e-5 };
    let lr = if c.tree.get("learning_rate").is_some() { c.f64("learning_rate")? } else { lr_default };
    c.carry("learning_rate", "optimizer.lr", lr);
    for (key, kiln) in [("weight_decay", "weight_decay"), ("adam_beta1", "beta1"), ("adam_beta2", "beta2"), ("adam_epsilon", "eps"), ("max_grad_norm", "max_grad_norm")] {
        let v = c.f64(key)?;
        c.carry(key, &format!("optimizer.{kiln}"), v);
    }

    // [train] recompute: Hugging Face's gradient checkpointing is kiln's per-layer checkpointing.
    if c.get("gradient_checkpointing") == Value::Bool(true) {
        c.carry("gradient_checkpointing", "train.recompute", true);
    }

    // [schedule]
    let kind_name = c.text("lr_scheduler_type").unwrap_or_default();
    if !["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"].contains(&kind_name.as_str()) {
        return Err(c.refuse("lr_scheduler_type", &Value::from(kind_name), "kiln's schedules are constant, constant_with_warmup, linear, cosine and cosine_with_min_lr"));
    }
    c.carry("lr_scheduler_type", "schedule.kind", kind_name.clone());
    if kind_name == "cosine_with_min_lr" {
        let kwargs = c.get("lr_scheduler_kwargs");
        match (kwargs.get("min_lr").and_then(Value::as_f64), kwargs.get("min_lr_rate").and_then(Value::as_f64)) {
            (Some(v), None) => c.carry("lr_scheduler_kwargs.min_lr", "schedule.min_lr", v),
            (None, Some(v)) => c.carry("lr_scheduler_kwargs.min_lr_rate", "schedule.min_lr_rate", v),
            _ => return Err(c.refuse("lr_scheduler_kwargs", &kwargs, "cosine_with_min_lr needs exactly one of min_lr or min_lr_rate")),
        }
    } else if c.tree.get("lr_scheduler_kwargs").is_some_and(|v| v.as_object().is_some_and(|m| !m.is_empty())) {
        let v = c.get("lr_scheduler_kwargs");
        return Err(c.refuse("lr_scheduler_kwargs", &v, "kiln takes scheduler arguments for cosine_with_min_lr only"));
    }
    let warmup_steps = c.f64("warmup_steps")?;
    if warmup_steps >= 1.0 {
        if warmup_steps.fract() != 0.0 {
            return Err(c.refuse("warmup_steps", &Value::from(warmup_steps), "a whole number of steps, or below 1 for a ratio of the run"));
        }
        c.carry("warmup_steps", "schedule.warmup_steps", warmup_steps as u64);
    } else if warmup_steps > 0.0 {
        c.carry("warmup_steps", "schedule.warmup_ratio", warmup_steps);
    } else {
        let ratio = c.f64("warmup_ratio")?;
        if ratio > 0.0 {
            c.carry("warmup_ratio", "schedule.warmup_ratio", ratio);
        }
    }

    // [train], [output]
    let max_steps = c.int("max_steps")?.unwrap_or(-1);
    if max_steps > 0 {
        c.carry("max_steps", "train.steps", max_steps);
        c.get("num_train_epochs");
    } else {
        let v = c.f64("num_train_epochs")?;
        c.carry("num_train_epochs", "train.epochs", v);
    }
    match c.text("save_strategy").as_deref() {
        Some("no") => {
            c.carry("save_strategy", "output.save_steps", 0.0);
            c.get("save_steps");
        }
        Some("epoch") => {
            // A checkpoint at the end of each of a whole number of epochs: that fraction of the run.
            let epochs = c.f64("num_train_epochs")?;
            if max_steps > 0 || epochs < 1.0 || epochs.fract() != 0.0 {
                let v = c.get("save_strategy");
                return Err(c.refuse("save_strategy", &v, "kiln saves per epoch only over a whole number of epochs without max_steps; give save_steps"));
            }
            c.carry("save_strategy", "output.save_steps", 1.0 / epochs);
            c.get("save_steps");
        }
        Some("steps") => {
            let v = c.f64("save_steps")?;
            c.carry("save_steps", "output.save_steps", v);
        }
        _ => {
            let v = c.get("save_strategy");
            return Err(c.refuse("save_strategy", &v, "kiln's save strategies are steps, epoch and no"));
        }
    }
    let seed = c.usize("seed")?;
    c.carry("seed", if grpo { "data.seed" } else { "train.seed" }, seed);
    let per_device = c.usize("per_device_train_batch_size")?;
    let accum = c.usize("gradient_accumulation_steps")?;
    c.carry("per_device_train_batch_size", "train.micro_batch", per_device);

    if !grpo {
        c.carry("gradient_accumulation_steps", "train.grad_accum", accum);
        let max_length = c.usize("max_length")?;
        c.carry("max_length", "data.max_length", max_length);
        sft_packing(&mut c, max_length)?;
        // (TRL renders with the tokenizer's own template unless this names another; so does kiln.)
        if let Some(template) = c.text("chat_template_path") {
            c.carry("chat_template_path", "data.chat_template", template);
        }
        // (the EOS the model is saved with; rows are always rendered as conversations, so it
        // is not appended to text as TRL appends it to non-conversational rows)
        if let Some(eos) = c.text("eos_token") {
            c.carry("eos_token", "data.eos_token", eos);
        }
        // SFTConfig's loss_type (TRL_DEFAULTS holds GRPOConfig's): nll, or chunked_nll, the same
        // loss computed in chunks, as kiln's is.
        if c.tree.get("loss_type").is_some() && !matches!(c.text("loss_type").as_deref(), Some("nll" | "chunked_nll")) {
            let v = c.get("loss_type");
            return Err(c.refuse("loss_type", &v, "kiln's SFT loss is the negative log-likelihood (nll, chunked_nll)"));
        }
        return close(path, c, kind);
    }

    // GRPO: the step's shape (one process: TRL's world size 1).
    let n = c.usize("num_generations")?;
    // Counts the step's shape divides by (TRL refuses 0 too, in its own checks).
    for (key, value) in [("per_device_train_batch_size", per_device), ("gradient_accumulation_steps", accum), ("num_generations", n)] {
        if value == 0 {
            let v = c.get(key);
            return Err(c.refuse(key, &v, "must be at least 1"));
        }
    }
    c.carry("num_generations", "rollout.n", n);
    let too_large = || Error::config(path, format!("per_device_train_batch_size ({per_device}) times gradient_accumulation_steps ({accum}) or steps_per_generation is too large"));
    let per_update = per_device.checked_mul(accum).ok_or_else(too_large)?;
    let given = |c: &mut Ctx<'_>, key: &str| -> Result<Option<usize>> { if c.tree.get(key).is_some_and(|v| !v.is_null()) { c.usize(key).map(Some) } else { Ok(None) } };
    let generation = match (given(&mut c, "generation_batch_size")?, given(&mut c, "steps_per_generation")?) {
        (Some(g), _) => g,
        (None, Some(s)) => per_device.checked_mul(s).ok_or_else(too_large)?,
        (None, None) => per_update,
    };
    c.used.extend(["generation_batch_size".to_owned(), "steps_per_generation".to_owned()]);
    if per_update % n != 0 || generation % per_update != 0 {
        return Err(Error::config(
            path,
            format!("per_device_train_batch_size x gradient_accumulation_steps ({per_update}) must be a multiple of num_generations ({n}) and divide the generation batch ({generation}) for kiln's whole prompt groups"),
        ));
    }
    c.carry("gradient_accumulation_steps", "train.mini_batch", per_update / n);
    c.carry("generation_batch_size", "train.prompts_per_step", generation / n);
    c.report.notes.push("batch sizes are for one process (TRL's world size 1); for N processes multiply mini_batch and prompts_per_step by N".into());
    let v = c.usize("max_completion_length")?;
    c.carry("max_completion_length", "rollout.max_response_length", v);
    if c.tree.get("max_prompt_length").is_some_and(|v| !v.is_null()) {
        let v = c.usize("max_prompt_length")?;
        c.carry("max_prompt_length", "data.max_prompt_length", v);
        c.report.notes.push("TRL cuts longer prompts from the left; kiln drops them and counts them".into());
    }
    for key in ["temperature", "top_p"] {
        let v = c.f64(key)?;
        c.carry(key, &format!("rollout.{key}"), v);
    }
    let top_k = c.int("top_k")?.unwrap_or(0).max(0);
    c.carry("top_k", "rollout.top_k", top_k);
    if !c.get("min_p").is_null() {
        let v = c.f64("min_p")?;
        c.carry("min_p", "rollout.min_p", v);
    }

    // [loss]
    let beta = c.f64("beta")?;
    c.carry("beta", "loss.kl_coef", beta);
    if beta > 0.0 {
        c.carry("beta", "loss.kl_estimator", "k3");
        c.report.notes.push("TRL's KL is k3 unclamped; kiln's k3 clamps as verl's low_var_kl".into());
    }
    let epsilon = c.f64("epsilon")?;
    c.carry("epsilon", "loss.clip_ratio", epsilon);
    if !c.get("epsilon_high").is_null() {
        let v = c.f64("epsilon_high")?;
        c.carry("epsilon_high", "loss.clip_ratio_high", v);
    }
    match c.get("delta") {
        Value::Null => {
            c.carry("delta", "loss.clip_ratio_c", 1e9);
            c.report.notes.push("TRL has no dual clip without delta: clip_ratio_c = 1e9 never binds".into());
        }
        _ => {
            let v = c.f64("delta")?;
            c.carry("delta", "loss.clip_ratio_c", v);
        }
    }
    let level = c.text("importance_sampling_level").unwrap_or_default();
    let mut policy_loss = match level.as_str() {
        "token" => "vanilla",
        "sequence" => "gspo",
        _ => return Err(c.refuse("importance_sampling_level", &Value::from(level), "kiln's levels are token (vanilla) and sequence (gspo)")),
    };
    let loss_type = c.text("loss_type").unwrap_or_default();
    let agg = match loss_type.as_str() {
        "grpo" => "seq-mean-token-mean",
        "bnpo" => "token-mean",
        "dapo" => {
            c.report.notes.push("loss_type dapo normalises by the tokens of the accumulated batch; kiln's token-mean by those of each micro-batch".into());
            "token-mean"
        }
        "dr_grpo" => "seq-mean-token-sum-norm-dr",
        "cispo" if policy_loss == "vanilla" => {
            policy_loss = "cispo";
            "token-mean"
        }
        _ => return Err(c.refuse("loss_type", &Value::from(loss_type), "kiln imports loss_type grpo, bnpo, dapo, dr_grpo and cispo (token level)")),
    };
    c.carry("loss_type", "loss.agg", agg);
    c.carry("importance_sampling_level", "loss.policy_loss", policy_loss);
    let scale = match c.get("scale_rewards") {
        Value::Bool(true) => "group".to_owned(),
        Value::Bool(false) => "none".to_owned(),
        Value::String(s) => s,
        other => other.to_string(),
    };
    match scale.as_str() {
        "group" | "batch" => c.carry("scale_rewards", "loss.reward_scaling", scale.clone()),
        "none" => c.carry("scale_rewards", "loss.adv_estimator", "dr_grpo"),
        _ => return Err(c.refuse("scale_rewards", &Value::from(scale), "kiln's scalings are group, batch and none")),
    }
    if c.get("use_vllm") == Value::Bool(true) && c.get("vllm_importance_sampling_correction") == Value::Bool(true) {
        let mode = c.text("vllm_importance_sampling_mode").unwrap_or_default();
        if mode != "token_truncate" {
            return Err(c.refuse("vllm_importance_sampling_mode", &Value::from(mode), "kiln's importance-sampling correction is token_truncate (TIS)"));
        }
        let key = if c.tree.get("vllm_importance_sampling_cap").is_some_and(|v| !v.is_null()) { "vllm_importance_sampling_cap" } else { "vllm_importance_sampling_clip_max" };
        let v = c.f64(key)?;
        c.carry(key, "loss.tis_imp_ratio_cap", v);
    } else {
        c.used.extend(["vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap"].map(String::from));
    }
    close(path, c, kind)
}

/// SFTConfig's `packing` and `padding_free`. Packing "bfd" (TRL's default strategy) packs rows
/// cut to `max_length` into bins of `max_length` and turns `padding_free` on (TRL's SFTTrainer:
/// `padding_free = args.padding_free or (args.packing and args.packing_strategy in {"bfd", …})`),
/// each row attending to itself with its own positions: kiln's `[data] neat_packing` with
/// `cutoff_len = max_length`, and `[train] padding_free`.
fn sft_packing(c: &mut Ctx<'_>, max_length: usize) -> Result<()> {
    let packing = match c.get("packing") {
        Value::Bool(b) => b,
        other => return Err(c.refuse("packing", &other, "expected true or false")),
    };
    let strategy = c.text("packing_strategy").unwrap_or_default();
    let mut padding_free = match c.get("padding_free") {
        Value::Bool(b) => b,
        other => return Err(c.refuse("padding_free", &other, "expected true or false")),
    };
    if packing {
        if strategy != "bfd" {
            let why = match strategy.as_str() {
                "bfd_split" => "kiln packs rows cut to max_length (bfd); bfd_split splits longer rows into several",
                _ => "kiln packs whole rows (bfd); wrapped packing cuts rows across blocks",
            };
            return Err(c.refuse("packing_strategy", &Value::from(strategy), why));
        }
        c.carry("packing", "data.neat_packing", true);
        c.carry("max_length", "data.cutoff_len", max_length);
        c.report.notes.push("packing bfd: kiln fills the bins first-fit-decreasing, TRL best-fit-decreasing; the bins can differ, every row's loss is the same".into());
        padding_free = true;
    }
    if padding_free {
        c.carry(if packing { "packing" } else { "padding_free" }, "train.padding_free", true);
    }
    Ok(())
}

/// Lists what was not read, and writes the config.
fn close(path: &Path, mut c: Ctx<'_>, kind: RunKind) -> Result<Imported> {
    let refused: BTreeSet<&str> = REFUSED.iter().map(|(k, _, _)| *k).collect();
    let keys: Vec<String> = c.tree.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    for key in keys {
        if c.used.contains(&key) || refused.contains(key.as_str()) {
            continue;
        }
        let other_kind = if kind == RunKind::Rl { SFT_KEYS } else { GRPO_KEYS };
        if IRRELEVANT.contains(&key.as_str()) {
            c.report.ignored.push((key, "irrelevant to kiln".into()));
        } else if other_kind.contains(&key.as_str()) {
            c.report.ignored.push((key, format!("not read by `kiln {}`", kind.name())));
        } else {
            c.report.unknown.push(key);
        }
    }
    let table: toml::Table = serde_json::from_value(c.out).map_err(|e| Error::config(path, format!("cannot write the imported config: {e}")))?;
    finish(path, table, kind, c.report)
}
