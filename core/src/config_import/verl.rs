//! `kiln config import --from verl`: a verl trainer config (`ppo_trainer.yaml`'s keys) with
//! Hydra-style overrides, as a `kiln rl` TOML.
//!
//! The file is laid over verl 0.9.1's own full config (`verl/trainer/config/
//! _generated_ppo_trainer.yaml` from the verl 0.9.1 wheel, [`VERL_DEFAULTS`]), then the
//! overrides (`key=value` for existing keys, `+key=value` to add one, `++key=value` either,
//! `~key` to remove), then OmegaConf interpolations are resolved. Every leaf is then
//!
//! - carried into a kiln key ([`MAPPING`] lists them);
//! - checked: a value that changes the training and has no kiln equivalent is refused with one
//!   line naming the file and the key ([`REFUSED`] and the checks in [`import`]);
//! - ignored (a non-default value of a setting that does not change what is trained:
//!   parallelism, memory, engines, logging…; [`INFRASTRUCTURE`] lists them): listed;
//! - refused, when it is any other non-default value kiln cannot reproduce (named with its
//!   default);
//! - unknown (not a verl 0.9.1 key): listed;
//! - or left at verl's default (counted).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::tree::{self, Override};
use super::{ImportReport, Imported, Refusals, RunKind, Source, finish};
use crate::error::{Error, Result};

/// verl 0.9.1's full trainer config (every default), from its wheel.
pub const VERL_DEFAULTS: &str = include_str!("verl_0_9_1_ppo_trainer.yaml");

const A: &str = "actor_rollout_ref.actor";
const R: &str = "actor_rollout_ref.rollout";

/// verl key → kiln key, for the README and the report.
pub const MAPPING: &[(&str, &str)] = &[
    ("actor_rollout_ref.model.path", "[model] from"),
    ("actor_rollout_ref.model.tokenizer_path", "[model] tokenizer"),
    ("actor_rollout_ref.rollout.dtype", "[model] dtype"),
    ("actor_rollout_ref.actor.fsdp_config.model_dtype, .dtype", "[train] precision (fp32 master + bfloat16 compute -> bf16-mixed)"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing (true)", "[train] recompute (per-layer checkpointing, the same gradients)"),
    ("data.train_files", "[data] files"),
    ("data.val_files", "[eval] rows (one file or directory)"),
    ("data.max_prompt_length", "[data] max_prompt_length"),
    ("data.seed", "[data] seed"),
    ("data.train_batch_size", "[train] prompts_per_step"),
    ("actor_rollout_ref.rollout.response_length (data.max_response_length)", "[rollout] max_response_length"),
    ("actor_rollout_ref.rollout.n", "[rollout] n"),
    ("actor_rollout_ref.rollout.temperature", "[rollout] temperature"),
    ("actor_rollout_ref.rollout.top_p", "[rollout] top_p"),
    ("actor_rollout_ref.rollout.top_k", "[rollout] top_k (-1 -> 0)"),
    ("actor_rollout_ref.rollout.max_num_batched_tokens", "[rollout] max_prefill_tokens (tokens one prefill pass takes)"),
    ("actor_rollout_ref.actor.optim.lr", "[optimizer] lr"),
    ("actor_rollout_ref.actor.optim.weight_decay", "[optimizer] weight_decay"),
    ("actor_rollout_ref.actor.optim.betas", "[optimizer] beta1, beta2"),
    ("actor_rollout_ref.actor.optim.clip_grad (actor.grad_clip)", "[optimizer] max_grad_norm"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type (warmup_style)", "[schedule] kind (constant; cosine -> cosine_with_min_lr)"),
    ("actor_rollout_ref.actor.optim.min_lr_ratio", "[schedule] min_lr_rate (cosine)"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "[schedule] warmup_steps (> 0)"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "[schedule] warmup_ratio"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "[train] mini_batch"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "[train] micro_batch"),
    ("actor_rollout_ref.actor.clip_ratio", "[loss] clip_ratio"),
    ("actor_rollout_ref.actor.clip_ratio_low", "[loss] clip_ratio_low"),
    ("actor_rollout_ref.actor.clip_ratio_high", "[loss] clip_ratio_high"),
    ("actor_rollout_ref.actor.clip_ratio_c", "[loss] clip_ratio_c"),
    ("actor_rollout_ref.actor.loss_agg_mode", "[loss] agg (seq-mean-token-sum-norm -> seq-mean-token-sum-norm-dr)"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "[loss] policy_loss (vanilla, gspo, cispo)"),
    ("actor_rollout_ref.actor.use_kl_loss", "[loss] kl_coef = 0 when false"),
    ("actor_rollout_ref.actor.kl_loss_coef", "[loss] kl_coef"),
    ("actor_rollout_ref.actor.kl_loss_type", "[loss] kl_estimator (low_var_kl -> k3, kl -> k1, mse -> k2)"),
    ("algorithm.adv_estimator", "[loss] adv_estimator (kiln's registered estimators: grpo, rloo, reinforce_plus_plus, opo)"),
    ("algorithm.norm_adv_by_std_in_grpo", "[loss] adv_estimator = \"dr_grpo\" when false with grpo"),
    ("algorithm.filter_groups.enable, .max_num_gen_batches", "[rollout.filter_groups] enable, max_num_gen_batches"),
    ("algorithm.rollout_correction.rollout_is = token, .rollout_is_threshold", "[loss] tis_imp_ratio_cap"),
    ("algorithm.rollout_correction.rollout_rs, .rollout_rs_threshold", "[loss] rollout_rs, rollout_rs_threshold"),
    ("reward.reward_kwargs.overlong_buffer_cfg.enable, .len, .penalty_factor (reward_model.overlong_buffer.*)", "[loss.overlong_buffer] enable, len, penalty_factor"),
    ("trainer.total_epochs", "[train] epochs"),
    ("trainer.total_training_steps", "[train] steps (when set)"),
    ("trainer.save_freq", "[output] save_steps (<= 0 -> 0: only the last step)"),
    ("trainer.test_freq", "[eval] every (<= 0: no [eval])"),
    ("trainer.default_local_dir", "[output] dir"),
];

/// Keys whose value changes the training and that kiln runs only at this value: (key, the
/// values kiln runs, why).
const REFUSED: &Refusals = &[
    ("algorithm.use_kl_in_reward", &["false"], "kiln has no KL penalty in the reward (use actor.use_kl_loss: [loss] kl_coef)"),
    ("algorithm.use_pf_ppo", &["false"], "kiln has no PF-PPO reweighting"),
    ("algorithm.rollout_correction.bypass_mode", &["false"], "kiln's old log-probs are the learner's (decoupled mode)"),
    ("algorithm.rollout_correction.rollout_is_batch_normalize", &["false"], "kiln does not normalise IS weights"),
    ("actor_rollout_ref.actor.entropy_coeff", &["0", "0.0"], "kiln has no entropy bonus"),
    ("actor_rollout_ref.actor.ppo_epochs", &["1"], "kiln makes one pass over a step's responses"),
    ("actor_rollout_ref.actor.loss_scale_factor", &["null"], "kiln's seq-mean-token-sum-norm-dr divides by max_response_length"),
    ("actor_rollout_ref.actor.qat.enable", &["false"], "kiln has no quantisation-aware training"),
    ("actor_rollout_ref.model.lora_rank", &["0"], "kiln trains every weight (no LoRA)"),
    ("actor_rollout_ref.model.lora.rank", &["0"], "kiln trains every weight (no LoRA)"),
    ("actor_rollout_ref.model.mtp.enable_train", &["false"], "kiln has no multi-token-prediction loss"),
    ("actor_rollout_ref.rollout.do_sample", &["true"], "kiln samples rollouts"),
    ("actor_rollout_ref.rollout.ignore_eos", &["false"], "kiln stops responses at EOS"),
    ("actor_rollout_ref.rollout.over_sample_rate", &["0", "0.0"], "kiln waits for every rollout"),
    ("actor_rollout_ref.rollout.multi_turn.enable", &["false"], "kiln's rollouts are single-turn"),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample", &["false"], "kiln validates greedily"),
    ("actor_rollout_ref.actor.optim.optimizer", &["\"AdamW\""], "kiln's optimizer is AdamW"),
    ("actor_rollout_ref.actor.optim.num_cycles", &["0.5"], "kiln's cosine is one half cycle"),
    ("reward.reward_model.enable", &["false"], "kiln's reward is its task's, not a reward model"),
    ("reward_model.enable", &["null", "false"], "kiln's reward is its task's, not a reward model"),
    ("reward.custom_reward_function.path", &["null"], "kiln's reward is its [task]'s; a Python reward function is not imported"),
    ("custom_reward_function.path", &["null"], "kiln's reward is its [task]'s; a Python reward function is not imported"),
    ("reward.reward_manager.name", &["\"naive\"", "\"dapo\""], "kiln scores like verl's naive (and, with the overlong buffer, dapo) reward manager"),
    ("distillation.enabled", &["false"], "kiln's distillation is `kiln opd` ([teacher]), not imported"),
    ("algorithm.filter_groups.metric", &["\"reward\"", "\"seq_final_reward\""], "kiln filters groups on the reward the advantages see"),
    ("data.shuffle", &["true"], "kiln shuffles the prompts every epoch ([data] seed)"),
    ("actor_rollout_ref.actor.shuffle", &["false"], "kiln lays a step's responses out in mini-batches in order"),
    ("algorithm.rollout_correction.loss_type", &["\"ppo_clip\""], "kiln's rollout correction weights the policy loss it runs"),
    ("trainer.val_only", &["false"], "kiln's rl trains (evaluate with `kiln eval`)"),
];

/// Settings that change how verl lays out, runs or logs the work, not what it trains: a
/// non-default value is listed as ignored with the reason. `*.x.` matches a segment anywhere, a
/// name ending in `.` (or `_`) every key it begins, anything else one key.
pub const INFRASTRUCTURE: &[(&str, &str)] = &[
    ("*.profiler.", "profiling"),
    ("global_profiler.", "profiling"),
    ("*.prometheus.", "monitoring"),
    ("*.trace.", "tracing"),
    ("ray_kwargs.", "verl's Ray runtime"),
    ("transfer_queue.", "verl's Ray runtime"),
    ("skip.", "verl's debugging shortcuts"),
    ("trainer.v1.", "verl's trainer implementation"),
    ("trainer.use_v1", "verl's trainer implementation"),
    ("*.fsdp_config.", "parallelism and memory"),
    ("*.megatron.", "parallelism and memory"),
    ("*.turbo_config.", "parallelism and memory"),
    ("*.checkpoint.", "what a checkpoint stores"),
    ("*.checkpoint_engine.", "weight transfer to the inference engine"),
    ("actor_rollout_ref.ref.", "the reference model's parallelism and batching (kiln's reference is the start model)"),
    ("actor_rollout_ref.hybrid_engine", "verl's colocation"),
    ("actor_rollout_ref.nccl_timeout", "verl's runtime"),
    ("actor_rollout_ref.actor.strategy", "parallelism and memory"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "batching by tokens (the same gradient)"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "batching by tokens (the same gradient)"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "batching (the same gradient)"),
    ("actor_rollout_ref.actor.use_torch_compile", "kernels"),
    ("actor_rollout_ref.actor.use_fused_kernels", "kernels"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "parallelism and memory"),
    ("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "memory"),
    ("actor_rollout_ref.actor.entropy_from_logits_chunk_size", "memory"),
    ("actor_rollout_ref.actor.entropy_checkpointing", "memory"),
    ("actor_rollout_ref.actor.pad_to_length", "padding (the same loss)"),
    ("actor_rollout_ref.actor.pad_to_length_bucket", "padding (the same loss)"),
    ("actor_rollout_ref.actor.use_remove_padding", "padding (the same loss)"),
    ("actor_rollout_ref.actor.calculate_entropy", "a logged metric"),
    ("actor_rollout_ref.actor.calculate_sum_pi_squared", "a logged metric"),
    ("actor_rollout_ref.actor.use_prefix_grouper", "kernels"),
    ("actor_rollout_ref.actor.rollout_n", "verl's copy of rollout.n"),
    ("actor_rollout_ref.actor.freeze_vision_tower", "vision models"),
    ("actor_rollout_ref.actor.data_loader_seed", "used only with actor.shuffle"),
    ("actor_rollout_ref.actor.tau_pos", "used only by loss modes kiln refuses"),
    ("actor_rollout_ref.actor.tau_neg", "used only by loss modes kiln refuses"),
    ("actor_rollout_ref.actor.policy_loss.", "used only by loss modes kiln refuses"),
    ("actor_rollout_ref.actor.qat.", "used only with qat.enable"),
    ("actor_rollout_ref.actor.optim.optimizer_impl", "the optimizer's implementation"),
    ("actor_rollout_ref.actor.optim.total_training_steps", "verl's copy of the run's steps"),
    ("actor_rollout_ref.actor.optim.zero_indexed_step", "verl's step counting"),
    ("actor_rollout_ref.rollout.name", "the inference engine"),
    ("actor_rollout_ref.rollout.mode", "the inference engine"),
    ("actor_rollout_ref.rollout.nnodes", "the inference engine's devices"),
    ("actor_rollout_ref.rollout.n_gpus_per_node", "the inference engine's devices"),
    ("actor_rollout_ref.rollout.full_determinism", "the inference engine"),
    ("actor_rollout_ref.rollout.seed", "the inference engine's random stream (kiln's is keyed by [data] seed)"),
    ("actor_rollout_ref.rollout.prompt_length", "verl's copy of data.max_prompt_length"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", "the inference engine's memory"),
    ("actor_rollout_ref.rollout.enforce_eager", "the inference engine"),
    ("actor_rollout_ref.rollout.cudagraph_capture_sizes", "the inference engine"),
    ("actor_rollout_ref.rollout.free_cache_engine", "the inference engine's memory"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "the inference engine's parallelism"),
    ("actor_rollout_ref.rollout.data_parallel_size", "the inference engine's parallelism"),
    ("actor_rollout_ref.rollout.expert_parallel_size", "the inference engine's parallelism"),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size", "the inference engine's parallelism"),
    ("actor_rollout_ref.rollout.max_model_len", "the inference engine's memory"),
    ("actor_rollout_ref.rollout.max_num_seqs", "the inference engine's batching"),
    ("actor_rollout_ref.rollout.enable_chunked_prefill", "the inference engine"),
    ("actor_rollout_ref.rollout.enable_prefix_caching", "the inference engine"),
    ("actor_rollout_ref.rollout.scheduling_policy", "the inference engine"),
    ("actor_rollout_ref.rollout.load_format", "the inference engine"),
    ("actor_rollout_ref.rollout.layered_summon", "the inference engine"),
    ("actor_rollout_ref.rollout.log_prob_", "batching of log-prob passes (the same values)"),
    ("actor_rollout_ref.rollout.disable_log_stats", "logging"),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", "the inference engine's memory"),
    ("actor_rollout_ref.rollout.router_config_path", "the inference engine"),
    ("actor_rollout_ref.rollout.agent.", "the inference engine's agent loop"),
    ("actor_rollout_ref.rollout.skip_tokenizer_init", "the inference engine"),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay", "mixture-of-experts models"),
    ("actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "mixture-of-experts models"),
    ("actor_rollout_ref.rollout.disaggregation.", "the inference engine's parallelism"),
    ("actor_rollout_ref.rollout.calculate_log_probs", "a logged metric"),
    ("actor_rollout_ref.rollout.val_kwargs.", "validation sampling (kiln validates greedily)"),
    ("actor_rollout_ref.rollout.multi_turn.", "used only with multi_turn.enable"),
    ("actor_rollout_ref.model.use_shm", "loading"),
    ("actor_rollout_ref.model.trust_remote_code", "loading"),
    ("actor_rollout_ref.model.external_lib", "loading"),
    ("actor_rollout_ref.model.enable_activation_offload", "memory"),
    ("actor_rollout_ref.model.use_remove_padding", "padding (the same loss)"),
    ("actor_rollout_ref.model.use_liger", "kernels"),
    ("actor_rollout_ref.model.use_fused_kernels", "kernels"),
    ("actor_rollout_ref.model.fused_kernel_options.", "kernels"),
    ("actor_rollout_ref.model.tiled_mlp.", "memory"),
    ("actor_rollout_ref.model.lora_alpha", "used only with LoRA"),
    ("actor_rollout_ref.model.target_modules", "used only with LoRA"),
    ("actor_rollout_ref.model.exclude_modules", "used only with LoRA"),
    ("actor_rollout_ref.model.lora_adapter_path", "used only with LoRA"),
    ("actor_rollout_ref.model.lora.", "used only with LoRA"),
    ("actor_rollout_ref.model.mtp.", "used only with multi-token prediction"),
    ("critic.", "kiln has no critic (used only by critic-based advantages, which kiln refuses)"),
    ("distillation.", "used only with distillation.enabled"),
    ("algorithm.pf_ppo.", "used only with algorithm.use_pf_ppo"),
    ("algorithm.lam", "GAE's, which kiln does not run"),
    ("reward.num_workers", "reward workers"),
    ("reward.reward_model.", "used only with a reward model"),
    ("reward.sandbox_fusion.", "verl's code-reward service (kiln grades in its own sandbox)"),
    ("reward.custom_reward_function.name", "used only with a reward function"),
    ("custom_reward_function.name", "used only with a reward function"),
    ("reward_model.", "used only with a reward model"),
    ("sandbox_fusion.", "verl's code-reward service (kiln grades in its own sandbox)"),
    ("data.use_shm", "loading"),
    ("data.prompt_key", "the rows' format (kiln reads its task's rows)"),
    ("data.reward_fn_key", "the rows' format (kiln reads its task's rows)"),
    ("data.return_raw_input_ids", "the rows' format"),
    ("data.return_raw_chat", "the rows' format"),
    ("data.return_full_prompt", "the rows' format"),
    ("data.return_multi_modal_inputs", "vision models"),
    ("data.image_key", "vision models"),
    ("data.video_key", "vision models"),
    ("data.audio_key", "vision models"),
    ("data.image_patch_size", "vision models"),
    ("data.dataloader_num_workers", "loading"),
    ("data.trust_remote_code", "loading"),
    ("data.filter_overlong_prompts", "kiln drops prompts over max_prompt_length (and counts them)"),
    ("data.filter_overlong_prompts_workers", "loading"),
    ("data.val_batch_size", "validation batching"),
    ("data.validation_shuffle", "validation order"),
    ("data.tool_config_path", "used only with multi-turn rollouts"),
    ("data.function_tool_path", "used only with multi-turn rollouts"),
    ("trainer.balance_batch", "which device gets which sequences (the same gradient)"),
    ("trainer.project_name", "logging"),
    ("trainer.experiment_name", "logging"),
    ("trainer.logger", "logging"),
    ("trainer.log_val_generations", "logging"),
    ("trainer.rollout_data_dir", "logging"),
    ("trainer.validation_data_dir", "logging"),
    ("trainer.nnodes", "devices (kiln's --nnodes / launchers)"),
    ("trainer.n_gpus_per_node", "devices (kiln's --devices / launchers)"),
    ("trainer.device", "devices (kiln's --backend)"),
    ("trainer.esi_redundant_time", "verl's runtime"),
    ("trainer.resume_mode", "resuming (kiln's --resume)"),
    ("trainer.resume_from_path", "resuming (kiln's --resume)"),
    ("trainer.del_local_ckpt_after_load", "resuming"),
    ("trainer.checkpoint_callback_class", "checkpoint hooks"),
    ("trainer.val_before_train", "when validation runs"),
    ("trainer.critic_warmup", "kiln has no critic"),
    ("trainer.default_hdfs_dir", "where checkpoints are copied"),
    ("trainer.max_actor_ckpt_to_keep", "how many checkpoints are kept"),
    ("trainer.max_critic_ckpt_to_keep", "kiln has no critic"),
    ("trainer.ray_wait_register_center_timeout", "verl's Ray runtime"),
];

/// Why `key` does not change what is trained, if [`INFRASTRUCTURE`] says so.
fn infrastructure(key: &str) -> Option<&'static str> {
    INFRASTRUCTURE.iter().find_map(|&(pattern, why)| {
        let hit = match pattern.strip_prefix('*') {
            Some(segment) => key.contains(segment) || key.ends_with(segment.trim_end_matches('.')),
            None if pattern.ends_with('.') || pattern.ends_with('_') => key.starts_with(pattern),
            None => key == pattern,
        };
        hit.then_some(why)
    })
}

/// Keys read by the importer besides the mapped ones (their values are checked there).
const READ: &[&str] = &[
    "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.actor.optim.warmup_style",
    "data.max_response_length",
    "algorithm.gamma",
    "algorithm.filter_groups.max_num_gen_batches",
    "algorithm.rollout_correction.rollout_is",
    "algorithm.rollout_correction.rollout_is_threshold",
    "algorithm.rollout_correction.rollout_rs",
    "algorithm.rollout_correction.rollout_rs_threshold",
    "reward_model.reward_manager",
];

/// Keys not in verl's full config that verl's DAPO reward manager reads.
const EXTRA_KEYS: &[&str] = &["reward.reward_kwargs.overlong_buffer_cfg.", "reward_model.overlong_buffer."];

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

    /// The resolved value at `key` (null if absent); marks it read.
    fn get(&mut self, key: &str) -> Value {
        self.used.insert(key.to_owned());
        tree::get(&self.tree, key).map(|v| tree::resolve(&self.tree, v)).unwrap_or(Value::Null)
    }
}

impl Ctx<'_> {
    /// Writes kiln's `dotted` key and records where it came from.
    fn carry(&mut self, from: &str, to: &str, value: impl Into<Value>) {
        let value = value.into();
        self.report.carried.push((from.to_owned(), format!("{to} = {value}")));
        tree::set(&mut self.out, to, value).expect("kiln keys are tables");
    }
}

fn dtype(name: &str) -> Option<&'static str> {
    match name {
        "bfloat16" | "bf16" => Some("bf16"),
        "float16" | "fp16" | "half" => Some("f16"),
        "float32" | "fp32" | "float" => Some("f32"),
        _ => None,
    }
}

/// Imports the verl config `text` (the file at `path`) with `overrides`.
pub fn import(path: &Path, text: &str, overrides: &[String]) -> Result<Imported> {
    let base = tree::parse_yaml(Path::new("verl_0_9_1_ppo_trainer.yaml"), VERL_DEFAULTS)?;
    let mut file = tree::parse_file(path, text)?;
    let mut report = ImportReport::default();
    if tree::remove(&mut file, "defaults") {
        report.notes.push("the file's Hydra `defaults` list is not composed: verl 0.9.1's full config is the base".into());
    }
    let mut written: BTreeSet<String> = tree::leaves(&file).into_iter().map(|(k, _)| k).collect();
    let mut merged = base.clone();
    tree::merge(&mut merged, file);
    for text in overrides {
        let o = Override::parse(text).map_err(|e| Error::config(path, e))?;
        o.apply(&mut merged).map_err(|e| Error::config(path, e))?;
        if let Some(node) = tree::get(&merged, &o.key) {
            written.extend(tree::leaves(node).into_iter().map(|(k, _)| if k.is_empty() { o.key.clone() } else { format!("{}.{k}", o.key) }));
        }
    }
    let mut c = Ctx { path, tree: merged, used: BTreeSet::new(), report, out: Value::Object(Default::default()) };

    // Values kiln cannot run.
    c.check_refused(REFUSED)?;

    // [model]
    let from = c.text("actor_rollout_ref.model.path").ok_or_else(|| Error::config(path, "actor_rollout_ref.model.path is required ([model] from)"))?;
    c.carry("actor_rollout_ref.model.path", "model.from", from);
    if let Some(tokenizer) = c.text("actor_rollout_ref.model.tokenizer_path") {
        c.carry("actor_rollout_ref.model.tokenizer_path", "model.tokenizer", tokenizer);
    }
    let key = format!("{R}.dtype");
    if let Some(name) = c.text(&key) {
        let kiln = dtype(&name).ok_or_else(|| c.refuse(&key, &Value::String(name.clone()), "kiln rolls out in f32, bf16 or f16"))?;
        c.carry(&key, "model.dtype", kiln);
    }

    // [train] precision: the actor's master weights (model_dtype) and compute (FSDP's mixed
    // precision dtype)
    let (master_key, compute_key) = (format!("{A}.fsdp_config.model_dtype"), format!("{A}.fsdp_config.dtype"));
    let (master, compute) = (c.text(&master_key).unwrap_or_else(|| "fp32".into()), c.text(&compute_key).unwrap_or_else(|| "fp32".into()));
    let precision = match (dtype(&master), dtype(&compute)) {
        (Some("f32"), Some("f32")) => "f32",
        (Some("f32"), Some("bf16")) => "bf16-mixed",
        (Some("f32"), Some("f16")) => "f16-mixed",
        (Some("bf16"), Some("bf16")) => "bf16-pure",
        _ => return Err(c.refuse(&compute_key, &Value::from(compute), &format!("with model_dtype {master}: kiln trains f32, bf16-mixed or f16-mixed (f32 master weights) or bf16-pure"))),
    };
    c.carry(&compute_key, "train.precision", precision);
    // [train] recompute: verl's gradient checkpointing is kiln's per-layer checkpointing.
    let key = "actor_rollout_ref.model.enable_gradient_checkpointing";
    if c.get(key) == Value::Bool(true) {
        c.carry(key, "train.recompute", true);
    }

    // [data]
    if let Some(rounds) = c.text("data.gen_batch_size") {
        c.report.notes.push(format!("data.gen_batch_size = {rounds}: kiln draws train_batch_size prompts per generation round (dynamic sampling refills with up to max_num_gen_batches rounds); the kept batch is the same"));
    }
    tree::set(&mut c.out, "data.kind", Value::from("prompts")).expect("a table");
    let files = match c.get("data.train_files") {
        Value::String(s) => vec![Value::String(s)],
        Value::Array(items) => items,
        other => return Err(c.refuse("data.train_files", &other, "expected a file or a list of files")),
    };
    c.carry("data.train_files", "data.files", files);
    c.report.notes.push("[data] files are verl's train_files as written: kiln reads its task's JSONL rows there (convert verl's Parquet prompts first)".into());
    let v = c.usize("data.max_prompt_length")?;
    c.carry("data.max_prompt_length", "data.max_prompt_length", v);
    if c.text("data.truncation").is_some_and(|t| t != "error") && c.get("data.filter_overlong_prompts") != Value::Bool(true) {
        c.report.notes.push("verl truncates overlong prompts here (data.truncation); kiln drops them and counts them".into());
    }
    if !c.get("data.seed").is_null() {
        let v = c.usize("data.seed")?;
        c.carry("data.seed", "data.seed", v);
    }
    let v = c.usize("data.train_batch_size")?;
    c.carry("data.train_batch_size", "train.prompts_per_step", v);

    // [rollout]
    c.get("data.max_response_length");
    let v = c.usize(&format!("{R}.response_length"))?;
    c.carry(&format!("{R}.response_length"), "rollout.max_response_length", v);
    let v = c.usize(&format!("{R}.n"))?;
    c.carry(&format!("{R}.n"), "rollout.n", v);
    for name in ["temperature", "top_p"] {
        let key = format!("{R}.{name}");
        let v = c.f64(&key)?;
        c.carry(&key, &format!("rollout.{name}"), v);
    }
    let key = format!("{R}.top_k");
    let top_k = c.int(&key)?.ok_or_else(|| c.refuse(&key, &Value::Null, "expected an integer"))?;
    c.carry(&key, "rollout.top_k", top_k.max(0));
    // vLLM's bound on a step's tokens bounds kiln's prefill passes (absent: kiln's default).
    let key = format!("{R}.max_num_batched_tokens");
    if !c.get(&key).is_null() {
        let v = c.usize(&key)?;
        c.carry(&key, "rollout.max_prefill_tokens", v);
    }

    // [optimizer], [schedule]
    let o = format!("{A}.optim");
    for (name, kiln) in [("lr", "optimizer.lr"), ("weight_decay", "optimizer.weight_decay")] {
        let key = format!("{o}.{name}");
        let v = c.f64(&key)?;
        c.carry(&key, kiln, v);
    }
    let key = format!("{o}.betas");
    match c.get(&key) {
        Value::Array(b) if b.len() == 2 && b.iter().all(Value::is_number) => {
            c.carry(&key, "optimizer.beta1", b[0].as_f64().unwrap_or_default());
            c.carry(&key, "optimizer.beta2", b[1].as_f64().unwrap_or_default());
        }
        other => return Err(c.refuse(&key, &other, "expected [beta1, beta2]")),
    }
    let (clip_grad, grad_clip) = (c.f64(&format!("{o}.clip_grad"))?, c.f64(&format!("{A}.grad_clip"))?);
    let max_grad_norm = match (clip_grad, grad_clip) {
        (a, b) if a == b || b == 1.0 => (format!("{o}.clip_grad"), a),
        (1.0, b) => (format!("{A}.grad_clip"), b),
        (_, b) => return Err(c.refuse(&format!("{A}.grad_clip"), &Value::from(b), &format!("differs from {o}.clip_grad ({clip_grad}); give one"))),
    };
    c.carry(&max_grad_norm.0, "optimizer.max_grad_norm", max_grad_norm.1);
    let key = format!("{o}.lr_scheduler_type");
    let scheduler = c.text(&format!("{o}.warmup_style")).or_else(|| c.text(&key)).unwrap_or_else(|| "constant".into());
    match scheduler.as_str() {
        "constant" => c.carry(&key, "schedule.kind", "constant"),
        "cosine" => {
            c.carry(&key, "schedule.kind", "cosine_with_min_lr");
            let v = c.f64(&format!("{o}.min_lr_ratio"))?;
            c.carry(&format!("{o}.min_lr_ratio"), "schedule.min_lr_rate", v);
        }
        other => return Err(c.refuse(&key, &Value::from(other), "kiln imports verl's constant and cosine schedules")),
    }
    let warmup_steps = c.int(&format!("{o}.lr_warmup_steps"))?.unwrap_or(-1);
    if warmup_steps > 0 {
        c.carry(&format!("{o}.lr_warmup_steps"), "schedule.warmup_steps", warmup_steps);
    } else {
        let ratio = c.f64(&format!("{o}.lr_warmup_steps_ratio"))?;
        if ratio > 0.0 {
            c.carry(&format!("{o}.lr_warmup_steps_ratio"), "schedule.warmup_ratio", ratio);
            c.report.notes.push("warm-up steps: verl takes int(ratio · steps), kiln ceil(ratio · steps)".into());
        }
    }

    // [train]
    let v = c.usize(&format!("{A}.ppo_mini_batch_size"))?;
    c.carry(&format!("{A}.ppo_mini_batch_size"), "train.mini_batch", v);
    let key = format!("{A}.ppo_micro_batch_size_per_gpu");
    if c.get(&key).is_null() {
        c.report.notes.push(format!("{key} is not set: kiln's micro_batch default (16) is used"));
    } else {
        let v = c.usize(&key)?;
        c.carry(&key, "train.micro_batch", v);
    }
    match c.get("trainer.total_training_steps") {
        Value::Null => {
            let v = c.f64("trainer.total_epochs")?;
            c.carry("trainer.total_epochs", "train.epochs", v);
        }
        _ => {
            let v = c.usize("trainer.total_training_steps")?;
            c.carry("trainer.total_training_steps", "train.steps", v);
            c.get("trainer.total_epochs");
            c.report.notes.push("trainer.total_training_steps is set: it bounds the run, trainer.total_epochs is not carried".into());
        }
    }

    // [loss]
    for name in ["clip_ratio", "clip_ratio_c"] {
        let key = format!("{A}.{name}");
        let v = c.f64(&key)?;
        c.carry(&key, &format!("loss.{name}"), v);
    }
    for name in ["clip_ratio_low", "clip_ratio_high"] {
        let key = format!("{A}.{name}");
        if !c.get(&key).is_null() {
            let v = c.f64(&key)?;
            c.carry(&key, &format!("loss.{name}"), v);
        }
    }
    let key = format!("{A}.loss_agg_mode");
    let agg = c.text(&key).unwrap_or_default();
    let kiln_agg = match agg.as_str() {
        "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum" => agg.clone(),
        // verl 0.9.1's mode; kiln's `seq-mean-token-sum-norm` is verl 0.5.0's.
        "seq-mean-token-sum-norm" => "seq-mean-token-sum-norm-dr".into(),
        _ => return Err(c.refuse(&key, &Value::from(agg), "not one of verl 0.9.1's loss_agg_modes kiln runs")),
    };
    c.carry(&key, "loss.agg", kiln_agg);
    let key = format!("{A}.policy_loss.loss_mode");
    let mode = c.text(&key).unwrap_or_default();
    if !crate::rl::loss::POLICY_LOSS_NAMES.contains(&mode.as_str()) {
        return Err(c.refuse(&key, &Value::from(mode), &format!("kiln's policy losses are {}", crate::rl::loss::POLICY_LOSS_NAMES.join(", "))));
    }
    c.carry(&key, "loss.policy_loss", mode);
    if c.get(&format!("{A}.use_kl_loss")) == Value::Bool(true) {
        let v = c.f64(&format!("{A}.kl_loss_coef"))?;
        c.carry(&format!("{A}.kl_loss_coef"), "loss.kl_coef", v);
        let key = format!("{A}.kl_loss_type");
        let kind = c.text(&key).unwrap_or_default();
        let kiln = match kind.as_str() {
            "low_var_kl" | "k3" => "k3",
            "kl" | "k1" => "k1",
            "mse" | "k2" => "k2",
            _ => return Err(c.refuse(&key, &Value::from(kind), "kiln's KL estimators are k1 (kl), k2 (mse) and k3 (low_var_kl)")),
        };
        c.carry(&key, "loss.kl_estimator", kiln);
    } else {
        c.carry(&format!("{A}.use_kl_loss"), "loss.kl_coef", 0.0);
    }
    let key = "algorithm.adv_estimator";
    let estimator = c.text(key).unwrap_or_default();
    let norm = c.get("algorithm.norm_adv_by_std_in_grpo") != Value::Bool(false);
    let kiln = match (estimator.as_str(), norm) {
        ("grpo", true) => "grpo",
        ("grpo", false) => {
            c.report.carried.push(("algorithm.norm_adv_by_std_in_grpo".into(), "[loss] adv_estimator = \"dr_grpo\" (no division by the group std)".into()));
            "dr_grpo"
        }
        ("reinforce_plus_plus", _) => {
            let gamma = c.f64("algorithm.gamma")?;
            if gamma != 1.0 {
                return Err(c.refuse("algorithm.gamma", &Value::from(gamma), "kiln's reinforce_plus_plus has gamma = 1"));
            }
            "reinforce_plus_plus"
        }
        // any other estimator kiln registers under verl's name
        (name, _) => match crate::rl::advantage::AdvEstimator::from_name(name) {
            Ok(registered) if name != "dr_grpo" => registered.name(),
            _ => {
                let names: Vec<&str> = crate::rl::advantage::ADV_ESTIMATORS.iter().map(|(n, _)| *n).filter(|n| *n != "dr_grpo").collect();
                return Err(c.refuse(key, &Value::from(estimator), &format!("kiln's advantage estimators are {} and dr_grpo (norm_adv_by_std_in_grpo=false)", names.join(", "))));
            }
        },
    };
    c.carry(key, "loss.adv_estimator", kiln);
    let rc = "algorithm.rollout_correction";
    match c.text(&format!("{rc}.rollout_is")).as_deref() {
        None => {}
        Some("token") => {
            let key = format!("{rc}.rollout_is_threshold");
            let cap = match c.f64(&key) {
                Ok(cap) => cap,
                Err(_) => {
                    let v = c.get(&key);
                    return Err(c.refuse(&key, &v, "kiln's TIS takes one upper bound (a number)"));
                }
            };
            c.carry(&key, "loss.tis_imp_ratio_cap", cap);
        }
        Some(other) => return Err(c.refuse(&format!("{rc}.rollout_is"), &Value::from(other), "kiln's truncated importance sampling is per token (rollout_is = token)")),
    }
    if let Some(options) = c.text(&format!("{rc}.rollout_rs")) {
        let key = format!("{rc}.rollout_rs_threshold");
        let threshold = c.get(&key);
        let text = match &threshold {
            Value::String(t) => t.clone(),
            Value::Number(n) => n.to_string(),
            _ => return Err(c.refuse(&key, &threshold, "rollout_rs needs a threshold (a number, or verl's string such as \"0.5_2.0\")")),
        };
        if let Err(why) = crate::rl::rejection::Rejection::parse(&options, &text) {
            return Err(c.refuse(&format!("{rc}.rollout_rs"), &Value::from(options), &why));
        }
        c.carry(&format!("{rc}.rollout_rs"), "loss.rollout_rs", options);
        c.carry(&key, "loss.rollout_rs_threshold", threshold);
    }

    // DAPO: dynamic sampling and the overlong buffer.
    if c.get("algorithm.filter_groups.enable") == Value::Bool(true) {
        let key = "algorithm.filter_groups.max_num_gen_batches";
        let n = c.usize(key)?;
        if n == 0 {
            return Err(c.refuse(key, &Value::from(0), "kiln needs a bound on the generations per step (verl's 0 is none)"));
        }
        c.carry("algorithm.filter_groups.enable", "rollout.filter_groups.enable", true);
        c.carry(key, "rollout.filter_groups.max_num_gen_batches", n);
    }
    let dapo = c.text("reward.reward_manager.name").as_deref() == Some("dapo") || c.text("reward_model.reward_manager").as_deref() == Some("dapo");
    for prefix in ["reward.reward_kwargs.overlong_buffer_cfg", "reward_model.overlong_buffer"] {
        if c.get(&format!("{prefix}.enable")) != Value::Bool(true) {
            continue;
        }
        if !dapo {
            c.report.notes.push(format!("{prefix} is enabled but verl applies it only with the dapo reward manager: not carried"));
            continue;
        }
        c.carry(&format!("{prefix}.enable"), "loss.overlong_buffer.enable", true);
        let len = c.usize(&format!("{prefix}.len"))?;
        c.carry(&format!("{prefix}.len"), "loss.overlong_buffer.len", len);
        if tree::get(&c.tree, &format!("{prefix}.penalty_factor")).is_some() {
            let v = c.f64(&format!("{prefix}.penalty_factor"))?;
            c.carry(&format!("{prefix}.penalty_factor"), "loss.overlong_buffer.penalty_factor", v);
        }
    }

    // [output], [eval]
    let dir = c.text("trainer.default_local_dir").unwrap_or_else(|| "checkpoints".into());
    c.carry("trainer.default_local_dir", "output.dir", dir);
    let save = c.int("trainer.save_freq")?.unwrap_or(-1);
    c.carry("trainer.save_freq", "output.save_steps", save.max(0) as f64);
    if save <= 0 {
        c.report.notes.push("trainer.save_freq <= 0: verl saves no checkpoint; kiln saves the last step only".into());
    }
    let test_freq = c.int("trainer.test_freq")?.unwrap_or(-1);
    let val = match c.get("data.val_files") {
        Value::String(s) => Some(s),
        Value::Array(items) if items.len() == 1 => items[0].as_str().map(str::to_owned),
        Value::Null => None,
        other => {
            c.report.notes.push(format!("data.val_files = {other}: kiln's [eval] rows is one file or directory; not carried"));
            None
        }
    };
    match (test_freq > 0, val) {
        (true, Some(rows)) => {
            c.carry("data.val_files", "eval.rows", rows);
            c.carry("trainer.test_freq", "eval.every", test_freq);
        }
        (false, _) => c.report.notes.push("trainer.test_freq <= 0: no validation ([eval] left out)".into()),
        (true, None) => c.report.notes.push("no single data.val_files: [eval] left out".into()),
    }

    // What was not read: ignored (known to verl, not at its default), unknown, or defaults.
    let refused: BTreeSet<&str> = REFUSED.iter().map(|(k, _, _)| *k).collect();
    let reads: BTreeSet<&str> = READ.iter().copied().collect();
    for (key, value) in tree::leaves(&c.tree) {
        let read = c.used.contains(&key) || refused.contains(key.as_str()) || reads.contains(key.as_str());
        if read || key.ends_with("._target_") || key == "_target_" {
            continue;
        }
        let default = tree::get(&base, &key);
        match default {
            Some(d) if *d == value => {
                if written.contains(&key) {
                    c.report.at_defaults += 1;
                }
            }
            Some(default) => {
                let why = if key.starts_with("algorithm.kl_ctrl.") || key == "algorithm.kl_penalty" {
                    "used only with algorithm.use_kl_in_reward, which kiln refuses"
                } else if key.starts_with(&format!("{A}.kl_loss")) {
                    "used only with actor.use_kl_loss"
                } else if let Some(why) = infrastructure(&key) {
                    why
                } else {
                    let default = tree::show(default);
                    return Err(c.refuse(&key, &value, &format!("kiln has no equivalent of this setting (verl's default: {default})")));
                };
                c.report.ignored.push((key, why.into()));
            }
            None if EXTRA_KEYS.iter().any(|p| key.starts_with(p)) => c.report.ignored.push((key, "read only with the dapo reward manager".into())),
            None => c.report.unknown.push(key),
        }
    }
    let table: toml::Table = serde_json::from_value(c.out).map_err(|e| Error::config(path, format!("cannot write the imported config: {e}")))?;
    finish(path, table, RunKind::Rl, c.report)
}
