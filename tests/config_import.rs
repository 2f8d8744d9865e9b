//! `kiln config show` and `kiln config import`: verl 0.9.1's own GRPO example imported with every
//! mapped value carried, a TRL GRPOConfig, unknown keys listed, values kiln cannot run refused
//! naming the file and the key, and `show` round trips on every committed example config.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixture;
use kiln::config_import::{self, Effective, RunKind};
use kiln::rl::PgConfig;
use kiln::rl::loss::{KlEstimator, LossAgg};
use kiln::train::config::{DataSection, Family, migrated_table};
use kiln::data::chat::TemplateChoice;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

/// The verl example's overrides (one per line, `#` comments).
fn verl_overrides() -> Vec<String> {
    let text = std::fs::read_to_string(fixture("config/verl/run_qwen3_4b_fsdp.overrides")).unwrap();
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

fn verl_import(extra: &[&str]) -> kiln::Result<config_import::Imported> {
    let path = fixture("config/verl/ppo_trainer.yaml");
    let mut overrides = verl_overrides();
    overrides.extend(extra.iter().map(|s| s.to_string()));
    config_import::verl::import(&path, &std::fs::read_to_string(&path).unwrap(), &overrides)
}

fn pg(imported: &config_import::Imported) -> &PgConfig {
    match &imported.config {
        Effective::PolicyGradient(c) => c,
        other => panic!("not an rl config: {other:?}"),
    }
}

/// Writes `text` and runs `kiln config show` on it: the effective config, read back.
fn show_through_binary(dir: &Path, name: &str, text: &str, kind: RunKind) -> PgConfig {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = kiln(&["config", "show", "--config", path.to_str().unwrap()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = dir.join(format!("shown_{name}"));
    std::fs::write(&shown, &stdout).unwrap();
    match config_import::effective(&shown, &stdout, kind).unwrap() {
        Effective::PolicyGradient(c) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn verl_grpo_example_is_imported_with_every_value() {
    let imported = verl_import(&[]).unwrap();
    assert_eq!(imported.kind, RunKind::Rl);
    let c = pg(&imported);
    // The example's overrides and verl 0.9.1's defaults, each in its kiln key.
    assert_eq!(c.model.from.as_deref(), Some(Path::new("Qwen/Qwen3-4B")));
    assert_eq!(c.model.dtype, Some(kiln::model::Dtype::BF16), "rollout.dtype bfloat16");
    let prompts = c.prompts().unwrap();
    assert_eq!(prompts.files, vec![PathBuf::from("~/data/gsm8k/train.parquet")]);
    assert_eq!(prompts.max_prompt_length, 1024);
    assert_eq!(c.train.prompts_per_step, 512, "data.train_batch_size");
    assert_eq!(c.train.mini_batch, 256, "ppo_mini_batch_size");
    assert_eq!(c.train.micro_batch, 2, "ppo_micro_batch_size_per_gpu");
    assert_eq!((c.train.epochs, c.train.steps), (Some(15.0), None), "trainer.total_epochs");
    assert_eq!(c.rollout.n, 5);
    assert_eq!(c.rollout.max_response_length, 1024);
    assert_eq!((c.rollout.temperature, c.rollout.top_p, c.rollout.top_k), (1.0, 1.0, 0), "verl's top_k -1 is kiln's 0");
    assert_eq!(c.optimizer.lr, 1e-6);
    assert_eq!(c.optimizer.weight_decay, 0.01);
    assert_eq!((c.optimizer.beta1, c.optimizer.beta2, c.optimizer.max_grad_norm), (0.9, 0.999, Some(1.0)));
    assert_eq!(c.schedule.kind, kiln::train::config::ScheduleKind::Constant);
    assert_eq!(c.train.precision, kiln::train::Precision::Bf16Mixed, "verl's actor: fp32 master weights, bfloat16 compute");
    assert!(c.train.recompute, "enable_gradient_checkpointing=True is kiln's per-layer recomputation");
    let l = &c.loss;
    assert_eq!((l.clip_ratio, l.clip_ratio_low, l.clip_ratio_high, l.clip_ratio_c), (0.2, Some(0.2), Some(0.2), 3.0));
    assert_eq!((l.kl_coef, l.kl_estimator), (0.001, KlEstimator::K3), "use_kl_loss, kl_loss_coef, kl_loss_type low_var_kl");
    assert_eq!(l.agg, LossAgg::TokenMean);
    assert_eq!((l.adv_estimator.name(), l.policy_loss.name()), ("grpo", "vanilla"));
    assert_eq!((l.tis_imp_ratio_cap, l.overlong_buffer, c.rollout.filter_groups), (None, None, None));
    assert_eq!(c.output.dir, PathBuf::from("checkpoints/verl_grpo_example_geo3k/glm41v_9b_function_rm"), "default_local_dir, interpolated");
    assert_eq!(c.output.save_steps, Some(20.0));
    let eval = c.eval.as_ref().unwrap();
    assert_eq!((eval.every, eval.rows.as_path()), (5, Path::new("~/data/gsm8k/test.parquet")));
    // Infrastructure the example sets is listed, not carried; nothing is unknown.
    let ignored: Vec<&str> = imported.report.ignored.iter().map(|(k, _)| k.as_str()).collect();
    for key in ["actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.rollout.name", "trainer.project_name"] {
        assert!(ignored.contains(&key), "{key} not listed: {ignored:?}");
    }
    assert!(imported.report.unknown.is_empty(), "{:?}", imported.report.unknown);

    // The written TOML is a config `kiln config show` (and so `kiln rl`) accepts, unchanged.
    let tmp = tempfile::tempdir().unwrap();
    let back = show_through_binary(tmp.path(), "imported.toml", &imported.to_toml("the verl example"), RunKind::Rl);
    assert_eq!(&back, c);
}

/// Each value the goal names, set by an override to something neither verl's nor kiln's default,
/// arrives in its kiln key, and the report says where it came from: a value dropped on the way
/// would leave kiln's default and fail here.
#[test]
fn every_verl_value_is_carried_not_defaulted() {
    let imported = verl_import(&[
        "actor_rollout_ref.actor.optim.lr=3e-6",
        "actor_rollout_ref.actor.optim.weight_decay=0.05",
        "actor_rollout_ref.rollout.n=7",
        "actor_rollout_ref.rollout.temperature=0.9",
        "actor_rollout_ref.rollout.top_p=0.95",
        "actor_rollout_ref.actor.kl_loss_coef=0.005",
        "actor_rollout_ref.actor.kl_loss_type=mse",
        "actor_rollout_ref.actor.clip_ratio=0.25",
        "actor_rollout_ref.actor.clip_ratio_low=0.15",
        "actor_rollout_ref.actor.clip_ratio_high=0.3",
        "actor_rollout_ref.actor.clip_ratio_c=4.0",
        "actor_rollout_ref.actor.optim.clip_grad=0.7",
        "trainer.total_training_steps=123",
        "trainer.save_freq=7",
        "data.train_batch_size=96",
        "actor_rollout_ref.actor.ppo_mini_batch_size=48",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "data.max_prompt_length=700",
        "actor_rollout_ref.rollout.response_length=900",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.fsdp_config.dtype=float16",
        "actor_rollout_ref.rollout.max_num_batched_tokens=4096",
    ])
    .unwrap();
    let c = pg(&imported);
    let (o, l, r, t) = (&c.optimizer, &c.loss, &c.rollout, &c.train);
    assert_eq!((o.lr, o.weight_decay, o.max_grad_norm), (3e-6, 0.05, Some(0.7)));
    assert_eq!((r.n, r.temperature, r.top_p, r.max_response_length, r.max_prefill_tokens), (7, 0.9, 0.95, 900, 4096));
    assert_eq!((l.kl_coef, l.kl_estimator), (0.005, KlEstimator::K2));
    assert_eq!((l.clip_ratio, l.clip_ratio_low, l.clip_ratio_high, l.clip_ratio_c), (0.25, Some(0.15), Some(0.3), 4.0));
    assert_eq!(l.agg, LossAgg::SeqMeanTokenMean);
    assert_eq!((t.steps, t.prompts_per_step, t.mini_batch, t.micro_batch), (Some(123), 96, 48, 3));
    assert_eq!(t.precision, kiln::train::Precision::F16Mixed);
    assert_eq!(c.output.save_steps, Some(7.0));
    assert_eq!(c.prompts().unwrap().max_prompt_length, 700);
    let carried: Vec<&str> = imported.report.carried.iter().map(|(from, _)| from.as_str()).collect();
    for key in [
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.optim.weight_decay",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.temperature",
        "actor_rollout_ref.rollout.top_p",
        "actor_rollout_ref.actor.kl_loss_coef",
        "actor_rollout_ref.actor.kl_loss_type",
        "actor_rollout_ref.actor.clip_ratio",
        "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.clip_ratio_high",
        "actor_rollout_ref.actor.clip_ratio_c",
        "actor_rollout_ref.actor.optim.clip_grad",
        "trainer.total_training_steps",
        "trainer.save_freq",
        "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "data.max_prompt_length",
        "actor_rollout_ref.rollout.response_length",
        "actor_rollout_ref.actor.loss_agg_mode",
        "actor_rollout_ref.actor.fsdp_config.dtype",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
    ] {
        assert!(carried.contains(&key), "{key} not reported carried: {carried:?}");
    }
}

/// A changed setting that alters what verl trains and that kiln cannot reproduce is refused by
/// name with verl's default (not listed as ignored), while infrastructure is listed with why.
#[test]
fn verl_settings_kiln_cannot_reproduce_are_refused_and_infrastructure_listed() {
    for (extra, expected) in [
        ("data.shuffle=False", "data.shuffle = false: kiln shuffles the prompts"),
        ("actor_rollout_ref.actor.shuffle=True", "actor_rollout_ref.actor.shuffle = true"),
        ("algorithm.rollout_correction.loss_type=reinforce", "algorithm.rollout_correction.loss_type"),
        ("actor_rollout_ref.model.custom_chat_template=x", "actor_rollout_ref.model.custom_chat_template = \"x\": kiln has no equivalent of this setting (verl's default: null)"),
        ("data.train_max_samples=100", "data.train_max_samples = 100: kiln has no equivalent"),
        ("actor_rollout_ref.rollout.quantization=fp8", "actor_rollout_ref.rollout.quantization"),
    ] {
        let err = verl_import(&[extra]).err().unwrap_or_else(|| panic!("{extra} was accepted")).to_string();
        assert!(err.contains("ppo_trainer.yaml") && err.contains(expected), "{extra}: {err}");
    }
    // an estimator kiln registers under verl's name is carried without a mapping of its own
    assert_eq!(pg(&verl_import(&["algorithm.adv_estimator=opo"]).unwrap()).loss.adv_estimator.name(), "opo");
    let imported = verl_import(&["actor_rollout_ref.rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=4", "data.gen_batch_size=1536"]).unwrap();
    let ignored: Vec<&str> = imported.report.ignored.iter().map(|(k, _)| k.as_str()).collect();
    assert!(ignored.contains(&"actor_rollout_ref.rollout.tensor_model_parallel_size") && ignored.contains(&"trainer.n_gpus_per_node"), "{ignored:?}");
    assert!(imported.report.notes.iter().any(|n| n.starts_with("data.gen_batch_size = 1536")), "{:?}", imported.report.notes);
}

#[test]
fn verl_dapo_keys_and_overrides_map_to_kiln_names() {
    let imported = verl_import(&[
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
        "actor_rollout_ref.actor.optim.weight_decay=0.1",
        "actor_rollout_ref.actor.optim.clip_grad=0.5",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.min_lr_ratio=0.1",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.top_p=0.9",
        "actor_rollout_ref.rollout.top_k=20",
        "algorithm.norm_adv_by_std_in_grpo=False",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.max_num_gen_batches=4",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=256",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "trainer.total_training_steps=300",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.rollout_correction.rollout_rs='token_k1,seq_mean_k3'",
        "algorithm.rollout_correction.rollout_rs_threshold='0.5_2.0,0.15'",
        "+actor_rollout_ref.actor.not_a_verl_key=3",
    ])
    .unwrap();
    let c = pg(&imported);
    let l = &c.loss;
    assert_eq!(l.policy_loss.name(), "gspo");
    assert_eq!(l.agg, LossAgg::SeqMeanTokenSumNormDr, "verl 0.9.1's seq-mean-token-sum-norm is kiln's -dr");
    assert_eq!((l.clip_ratio_high, l.clip_ratio_c), (Some(0.28), 10.0));
    assert_eq!(l.adv_estimator.name(), "dr_grpo", "norm_adv_by_std_in_grpo=False");
    assert_eq!(l.tis_imp_ratio_cap, Some(2.0));
    assert_eq!((l.rollout_rs.as_deref(), l.rejection().unwrap().unwrap().criteria().count()), (Some("token_k1,seq_mean_k3"), 2), "MIS carried");
    assert_eq!(l.kl_coef, 0.0, "use_kl_loss=False");
    let o = l.overlong_buffer.unwrap();
    assert_eq!((o.enable, o.len, o.penalty_factor), (true, 256, 0.5));
    let f = c.rollout.filter_groups.unwrap();
    assert_eq!((f.enable, f.max_num_gen_batches), (true, 4));
    assert_eq!((c.rollout.temperature, c.rollout.top_p, c.rollout.top_k), (0.7, 0.9, 20));
    assert_eq!((c.optimizer.weight_decay, c.optimizer.max_grad_norm), (0.1, Some(0.5)));
    assert_eq!(c.schedule.kind, kiln::train::config::ScheduleKind::CosineWithMinLr);
    assert_eq!((c.schedule.min_lr_rate, c.schedule.warmup_steps), (Some(0.1), Some(10)));
    assert_eq!((c.train.steps, c.train.epochs), (Some(300), None), "total_training_steps bounds the run");
    assert_eq!(imported.report.unknown, vec!["actor_rollout_ref.actor.not_a_verl_key".to_string()], "an unknown key is listed");
    let text = imported.to_toml("x");
    assert!(text.contains("# unknown: actor_rollout_ref.actor.not_a_verl_key"), "{text}");
}

#[test]
fn values_kiln_cannot_run_are_refused_naming_file_and_key() {
    let path = fixture("config/verl/ppo_trainer.yaml");
    for (extra, key) in [
        ("algorithm.use_kl_in_reward=True", "algorithm.use_kl_in_reward = true: kiln has no KL penalty in the reward"),
        ("actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.entropy_coeff = 0.01"),
        ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs = 2"),
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator = \"gae\""),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov", "actor_rollout_ref.actor.policy_loss.loss_mode = \"clip_cov\""),
        ("actor_rollout_ref.actor.not_a_key=1", "could not override 'actor_rollout_ref.actor.not_a_key'"),
    ] {
        let err = verl_import(&[extra]).unwrap_err().to_string();
        assert!(err.starts_with(path.to_str().unwrap()) && err.contains(key), "{err}");
    }
    // Through the binary: one line naming the file and the key, no output written.
    let tmp = tempfile::tempdir().unwrap();
    let out_path = tmp.path().join("run.toml");
    let mut args = vec!["config".to_string(), "import".into(), "--from".into(), "verl".into(), path.to_str().unwrap().into()];
    args.extend(verl_overrides());
    args.extend(["algorithm.use_kl_in_reward=True".into(), "--out".into(), out_path.to_str().unwrap().into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(&args).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: {}: algorithm.use_kl_in_reward", path.display())), "{stderr}");
    assert!(!out_path.exists());
    // Written once; the same import again leaves it; over another file (a hand-edited config)
    // it is refused and the file kept.
    let args: Vec<String> = args.into_iter().filter(|a| a != "algorithm.use_kl_in_reward=True").collect();
    for _ in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(String::from_utf8(Command::new(env!("CARGO_BIN_EXE_kiln")).args(&args).output().unwrap().stderr).unwrap().contains("run.toml: unchanged"));
    std::fs::write(&out_path, "# mine\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(&args).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && stderr.lines().count() == 1 && stderr.contains("run.toml: exists and differs"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "# mine\n");

    // TRL: a second optimisation pass per generation is refused.
    let trl = fixture("config/trl/grpo_config.json");
    let text = std::fs::read_to_string(&trl).unwrap().replace("\"num_iterations\": 1", "\"num_iterations\": 2");
    let err = config_import::trl::import(&trl, &text, &["model_name_or_path=m".into(), "dataset_name=d.jsonl".into()], None).unwrap_err().to_string();
    assert!(err.starts_with(trl.to_str().unwrap()) && err.contains("num_iterations = 2"), "{err}");
}

/// Whole numbers written as floats (`max_steps: 200.0`, as YAML and hand edits write them) are
/// the integers Python reads; a fraction is refused by key. A value kiln's checks refuse after
/// the import is named by the source key it came from, not by a line of the TOML kiln wrote.
#[test]
fn whole_floats_are_integers_and_refusals_name_the_source_key() {
    let trl = fixture("config/trl/grpo_config.json");
    let text = std::fs::read_to_string(&trl).unwrap().replace("\"max_steps\": 200,", "\"max_steps\": 200.0,").replace("\"top_k\": 50,", "\"top_k\": 50.0,");
    let import = |extra: &[&str]| {
        let mut overrides = vec!["model_name_or_path=m".to_string(), "dataset_name=d.jsonl".into()];
        overrides.extend(extra.iter().map(|s| s.to_string()));
        config_import::trl::import(&trl, &text, &overrides, None)
    };
    let imported = import(&[]).unwrap();
    assert_eq!((pg(&imported).train.steps, pg(&imported).train.epochs, pg(&imported).rollout.top_k), (Some(200), None, 50), "200.0 steps, not epochs");
    for (extra, expected) in [
        ("max_steps=10.5", "max_steps = 10.5: expected an integer"),
        ("generation_batch_size=64.5", "generation_batch_size = 64.5: expected a non-negative integer"),
        ("warmup_steps=10.5", "warmup_steps = 10.5: a whole number of steps"),
        ("learning_rate=-1", "learning_rate (imported as optimizer.lr): "),
    ] {
        let err = import(&[extra]).err().unwrap_or_else(|| panic!("{extra} is refused")).to_string();
        assert!(err.starts_with(&format!("{}: {expected}", trl.display())), "{extra}: {err}");
    }
    let imported = verl_import(&["trainer.save_freq=10.0"]).unwrap();
    assert_eq!(pg(&imported).output.save_steps, Some(10.0));
    let path = fixture("config/verl/ppo_trainer.yaml");
    for (extra, expected) in [
        ("trainer.test_freq=2.5", "trainer.test_freq = 2.5: expected an integer"),
        ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr (imported as optimizer.lr): "),
    ] {
        let err = verl_import(&[extra]).err().unwrap_or_else(|| panic!("{extra} is refused")).to_string();
        assert!(err.starts_with(&format!("{}: {expected}", path.display())), "{extra}: {err}");
    }
}

/// TRL's CLI takes its configs as YAML: the same GRPOConfig written so imports to the same config.
#[test]
fn a_trl_yaml_recipe_imports_as_its_json() {
    let overrides = ["model_name_or_path=Qwen/Qwen2.5-0.5B".to_string(), "dataset_name=prompts.jsonl".into()];
    let import = |name: &str| {
        let path = fixture(&format!("config/trl/{name}"));
        config_import::trl::import(&path, &std::fs::read_to_string(&path).unwrap(), &overrides, None).unwrap()
    };
    let (yaml, json) = (import("grpo_config.yaml"), import("grpo_config.json"));
    assert_eq!(pg(&yaml), pg(&json));
    assert_eq!((yaml.report.carried.len(), yaml.report.unknown.len()), (json.report.carried.len(), 0));
    assert!(pg(&yaml).rollout.n == 8 && pg(&yaml).optimizer.lr == 5e-7, "values carried, not defaults");
}

#[test]
fn trl_grpo_config_is_imported_with_trl_names() {
    let path = fixture("config/trl/grpo_config.json");
    let text = std::fs::read_to_string(&path).unwrap().replace("\"seed\": 7,", "\"seed\": 7,\n  \"not_a_trl_field\": 1,");
    let overrides = ["model_name_or_path=Qwen/Qwen2.5-0.5B".to_string(), "dataset_name=prompts.jsonl".into()];
    let imported = config_import::trl::import(&path, &text, &overrides, None).unwrap();
    assert_eq!(imported.kind, RunKind::Rl);
    let c = pg(&imported);
    assert_eq!(c.model.from.as_deref(), Some(Path::new("Qwen/Qwen2.5-0.5B")));
    assert_eq!(c.prompts().unwrap().files, vec![PathBuf::from("prompts.jsonl")]);
    assert_eq!(c.prompts().unwrap().seed, 7);
    assert_eq!(c.output.dir, PathBuf::from("runs/qwen-grpo"));
    assert_eq!((c.optimizer.lr, c.optimizer.weight_decay, c.optimizer.beta2, c.optimizer.max_grad_norm), (5e-7, 0.1, 0.99, Some(0.5)));
    assert_eq!((c.optimizer.beta1, c.optimizer.eps), (0.9, 1e-8), "TRL's defaults where the file is silent");
    assert_eq!((c.schedule.kind, c.schedule.warmup_ratio), (kiln::train::config::ScheduleKind::Cosine, 0.1));
    assert_eq!((c.train.steps, c.train.epochs), (Some(200), None), "max_steps bounds the run");
    // 16 completions per device x 4 accumulation steps = 64 completions = 8 prompts x 8.
    assert_eq!((c.train.micro_batch, c.train.mini_batch, c.train.prompts_per_step), (16, 8, 8));
    assert_eq!(c.output.save_steps, Some(50.0));
    assert_eq!(c.rollout.n, 8);
    assert_eq!(c.rollout.max_response_length, 768);
    assert_eq!((c.rollout.temperature, c.rollout.top_p, c.rollout.top_k), (0.9, 0.95, 50));
    let l = &c.loss;
    assert_eq!((l.kl_coef, l.kl_estimator), (0.04, KlEstimator::K3), "beta");
    assert_eq!((l.clip_ratio, l.clip_ratio_high), (0.2, Some(0.28)), "TRL's epsilon is the clip range");
    assert_eq!(l.epsilon, 1e-6, "kiln's epsilon (the std's) is untouched");
    assert_eq!(l.clip_ratio_c, 1e9, "no delta: no dual clip");
    assert_eq!(l.agg, LossAgg::SeqMeanTokenSumNormDr, "loss_type dr_grpo");
    assert_eq!(l.reward_scaling, kiln::rl::advantage::RewardScaling::Batch);
    assert_eq!(l.policy_loss.name(), "gspo", "importance_sampling_level sequence");
    assert_eq!(l.tis_imp_ratio_cap, Some(2.0), "vLLM token_truncate correction");
    assert_eq!(imported.report.unknown, vec!["not_a_trl_field".to_string()]);
    let ignored: Vec<&str> = imported.report.ignored.iter().map(|(k, _)| k.as_str()).collect();
    assert!(["bf16", "logging_steps", "report_to"].iter().all(|k| ignored.contains(k)), "{ignored:?}");

    let tmp = tempfile::tempdir().unwrap();
    let back = show_through_binary(tmp.path(), "trl.toml", &imported.to_toml("trl"), RunKind::Rl);
    assert_eq!(&back, c);

    // scale_rewards none is Dr. GRPO's estimator; loss_type grpo is the per-sequence mean.
    let text = text.replace("\"batch\"", "\"none\"").replace("\"dr_grpo\"", "\"grpo\"");
    let imported = config_import::trl::import(&path, &text, &overrides, None).unwrap();
    assert_eq!((pg(&imported).loss.adv_estimator.name(), pg(&imported).loss.agg), ("dr_grpo", LossAgg::SeqMeanTokenMean));
    assert_eq!(pg(&imported).rollout.min_p, 0.0, "TRL's min_p None: off");

    // min_p is carried to [rollout] and checked there like every sampling knob.
    let text_min_p = text.replace("\"top_k\": 50,", "\"top_k\": 50,\n  \"min_p\": 0.05,");
    let imported = config_import::trl::import(&path, &text_min_p, &overrides, None).unwrap();
    assert_eq!(pg(&imported).rollout.min_p, 0.05);
    let back = show_through_binary(tmp.path(), "trl_min_p.toml", &imported.to_toml("trl"), RunKind::Rl);
    assert_eq!(back.rollout.min_p, 0.05);
    let text_bad = text.replace("\"top_k\": 50,", "\"top_k\": 50,\n  \"min_p\": 1.5,");
    let err = config_import::trl::import(&path, &text_bad, &overrides, None).err().expect("min_p 1.5 is refused").to_string();
    assert!(err.contains("min_p") && err.contains("trl"), "{err}");

    // Zero counts in the step's shape are refused by name (they divided by zero).
    for (key, zero) in [("num_generations", "num_generations=0"), ("per_device_train_batch_size", "per_device_train_batch_size=0"), ("gradient_accumulation_steps", "gradient_accumulation_steps=0")] {
        let overrides = [overrides[0].clone(), overrides[1].clone(), zero.to_string()];
        let err = config_import::trl::import(&path, &text, &overrides, None).err().unwrap_or_else(|| panic!("{zero} is refused")).to_string();
        assert!(err.contains(key) && err.contains("at least 1") && err.contains("grpo_config.json"), "{zero}: {err}");
    }
    // Counts whose product overflows are one error, not a panic (or a wrapped 0 to divide by).
    let overrides = [overrides[0].clone(), overrides[1].clone(), "per_device_train_batch_size=4611686018427387904".to_string()];
    let err = config_import::trl::import(&path, &text, &overrides, None).err().expect("an overflowing batch is refused").to_string();
    assert!(err.contains("grpo_config.json") && err.contains("is too large"), "{err}");
}

#[test]
fn trl_sft_config_with_packing_is_imported() {
    let path = fixture("config/trl/sft_config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let overrides = ["model_name_or_path=Qwen/Qwen2.5-1.5B-Instruct".to_string(), "dataset_name=rows.jsonl".into()];
    let imported = config_import::trl::import(&path, &text, &overrides, None).unwrap();
    assert_eq!(imported.kind, RunKind::Sft);
    let Effective::NextToken(c) = &imported.config else { panic!("{:?}", imported.config) };
    let DataSection::Sft(data) = &c.data else { panic!("{:?}", c.data) };
    assert_eq!(data.path, PathBuf::from("rows.jsonl"));
    // packing (strategy bfd, TRL's default): rows cut to max_length, packed into bins of it, and
    // padding-free as TRL's SFTTrainer turns it on.
    assert_eq!((data.max_length, data.cutoff_len, data.neat_packing), (Some(16384), 16384, true));
    assert!(c.train.padding_free, "TRL's bfd packing is padding-free");
    assert_eq!((c.train.micro_batch, c.train.grad_accum, c.train.epochs, c.train.seed), (2, 8, Some(5.0), 42));
    assert_eq!(c.output.save_steps, Some(0.2), "save_strategy epoch over 5 epochs");
    assert_eq!((c.schedule.min_lr_rate, c.schedule.warmup_ratio), (Some(0.1), 0.03));
    let ignored: Vec<&str> = imported.report.ignored.iter().map(|(k, _)| k.as_str()).collect();
    assert!(["bf16", "use_liger_kernel"].iter().all(|k| ignored.contains(k)), "{ignored:?}");
    assert!(c.train.recompute, "gradient_checkpointing: true is kiln's per-layer recomputation");
    assert!(imported.report.unknown.is_empty(), "{:?}", imported.report.unknown);
    assert_eq!(data.chat_template, None, "TRL's default: the tokenizer's own template, as kiln's");
    // chat_template_path names another template (it was ignored as irrelevant).
    let named = [overrides[0].clone(), overrides[1].clone(), "chat_template_path=templates/r1.jinja".into()];
    let with_template = config_import::trl::import(&path, &text, &named, None).unwrap();
    let Effective::NextToken(named) = &with_template.config else { panic!() };
    let DataSection::Sft(named) = &named.data else { panic!() };
    assert_eq!(named.chat_template, Some(TemplateChoice::Path("templates/r1.jinja".into())));
    assert_eq!(data.eos_token, None);
    // eos_token: the EOS the checkpoints are saved with (it was ignored as irrelevant).
    let with_eos = [overrides[0].clone(), overrides[1].clone(), "eos_token=<|im_end|>".into()];
    let with_eos = config_import::trl::import(&path, &text, &with_eos, None).unwrap();
    let Effective::NextToken(with_eos) = &with_eos.config else { panic!() };
    let DataSection::Sft(with_eos) = &with_eos.data else { panic!() };
    assert_eq!(with_eos.eos_token.as_deref(), Some("<|im_end|>"));

    // Written and read back through `kiln config show`: the same run.
    let tmp = tempfile::tempdir().unwrap();
    let written = tmp.path().join("sft.toml");
    std::fs::write(&written, imported.to_toml("trl")).unwrap();
    let out = kiln(&["config", "show", "--config", written.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = tmp.path().join("shown.toml");
    std::fs::write(&shown, &out.stdout).unwrap();
    let back = config_import::effective(&shown, &String::from_utf8(out.stdout).unwrap(), RunKind::Sft).unwrap();
    let Effective::NextToken(back) = back else { panic!("{back:?}") };
    assert_eq!((back.data.clone(), back.train.padding_free), (c.data.clone(), true));

    // padding_free alone flattens each micro-batch; the strategies kiln does not pack with are refused.
    let alone = text.replace("\"packing\": true", "\"padding_free\": true");
    let imported = config_import::trl::import(&path, &alone, &overrides, None).unwrap();
    let Effective::NextToken(c) = &imported.config else { panic!() };
    let DataSection::Sft(data) = &c.data else { panic!() };
    assert_eq!((data.neat_packing, c.train.padding_free), (false, true));
    for (strategy, why) in [("wrapped", "cuts rows across blocks"), ("bfd_split", "splits longer rows")] {
        let refused = text.replace("\"packing\": true", &format!("\"packing\": true,\n  \"packing_strategy\": \"{strategy}\""));
        let err = config_import::trl::import(&path, &refused, &overrides, None).err().expect("refused").to_string();
        assert!(err.contains("sft_config.json") && err.contains(&format!("packing_strategy = \"{strategy}\"")) && err.contains(why), "{err}");
    }
    // SFTConfig's loss: nll when the file is silent (not GRPOConfig's dapo); chunked_nll is nll.
    let chunked = text.replace("\"seed\": 42,", "\"seed\": 42,\n  \"loss_type\": \"chunked_nll\",");
    assert!(config_import::trl::import(&path, &chunked, &overrides, None).is_ok());
    let err = config_import::trl::import(&path, &chunked.replace("chunked_nll", "dft"), &overrides, None).err().expect("dft refused").to_string();
    assert!(err.contains("loss_type = \"dft\""), "{err}");
    let refused = text.replace("\"save_strategy\": \"epoch\"", "\"save_strategy\": \"epoch\", \"max_steps\": 100");
    let err = config_import::trl::import(&path, &refused, &overrides, None).err().expect("refused").to_string();
    assert!(err.contains("save_strategy") && err.contains("give save_steps"), "{err}");
}

/// Every committed run config under examples/configs/.
fn example_configs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "toml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/configs"), &mut out);
    out.sort();
    out
}

#[test]
fn show_round_trips_every_example_config() {
    let tmp = tempfile::tempdir().unwrap();
    let mut shown = 0;
    for path in example_configs() {
        let text = std::fs::read_to_string(&path).unwrap();
        if path.ends_with("release/release.toml") {
            let err = config_import::show(&path, &text, None).unwrap_err().to_string();
            assert!(err.contains("a release recipe"), "{err}");
            continue;
        }
        let (kind, printed) = config_import::show(&path, &text, None).unwrap();
        // Read back: the same effective config, and printing it again gives the same text.
        let again = tmp.path().join("again.toml");
        std::fs::write(&again, &printed).unwrap();
        let original = config_import::effective(&path, &text, kind).unwrap();
        let reread = config_import::effective(&again, &printed, kind).unwrap();
        assert_eq!(original, reread, "{}", path.display());
        assert_eq!(config_import::show(&again, &printed, Some(kind)).unwrap().1, printed, "{}", path.display());
        // The printed config is in the current schema: no legacy key is left.
        assert!(config_import::legacy_notes(&printed, kind).is_empty(), "{}: {printed}", path.display());
        shown += 1;
    }
    assert!(shown >= 15, "{shown} example configs");

    // Through the binary: the legacy keys of the seed-style config (as committed before the
    // examples were upgraded) are named on stderr, and a default the file leaves out is written.
    let path = fixture("config/legacy_examples/rl_op11_14.toml");
    let out = kiln(&["config", "show", "--config", path.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{stderr}");
    for note in ["[train] lr is read as [optimizer] lr", "[validation] is read as [eval]", "[output] save_freq is read as [output] save_steps"] {
        assert!(stderr.contains(note), "{stderr}");
    }
    assert!(stdout.contains("[optimizer]\nlr = ") && stdout.contains("batch_size = 64") && stdout.contains("policy_loss = \"vanilla\""), "{stdout}");
    // --kind must agree with the file.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/configs/rl_op11_14.toml");
    let out = kiln(&["config", "show", "--config", path.to_str().unwrap(), "--kind", "opd"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("needs a [teacher]"));
}

/// Configs in every old form the loader accepts (core/src/train/config/legacy.rs, serde's old
/// key names, verl's kl_estimator names), with their run.
const LEGACY_PRETRAIN: &str = r#"
[model]
init = "model/config.json"
seed = 3
[data]
interplay = "data"
ops = [2, 3]
probs = [0.5, 0.5]
tokens = "2M"
[train]
steps = 100
micro_batch = 4
grad_accum = 2
lr = 3e-4
weight_decay = 0.1
max_grad_norm = 0.5
beta1 = 0.8
beta2 = 0.95
eps = 1e-6
schedule = "cosine_then_floor"
warmup_steps = 5
decay_steps = 80
floor_lr = 1e-5
[output]
dir = "out"
save_steps = 0.25
[eval]
heldout = "heldout"
accuracy_ops = [2, 3]
accuracy_rows = 5
every = 10
"#;

const LEGACY_SFT: &str = r#"
[model]
from = "base"
[data]
sft = "rows.parquet"
sft_columns = { prompt = "prompt", completion = "generation" }
sft_heldout = 8
sft_split_key = "id"
max_length = 512
[train]
epochs = 2
micro_batch = 2
lr = 1e-5
schedule = "linear"
warmup_ratio = 0.03
[output]
dir = "out"
[eval]
every = 5
"#;

const LEGACY_RL: &str = r#"
[model]
from = "base"
[data]
dir = "prompts"
ops = [11, 12]
[train]
steps = 10
lr = 2e-6
schedule = "cosine"
min_lr_ratio = 0.1
warmup_steps = 2
[loss]
loss_agg_mode = "seq-mean-token-mean"
kl_estimator = "low_var_kl"
[output]
dir = "out"
save_freq = 5
[validation]
dir = "val"
every = 5
"#;

const LEGACY_OPD: &str = r#"
[model]
from = "base"
[data]
files = ["a.jsonl", "b.jsonl"]
[train]
steps = 10
schedule = "cosine"
[loss]
kl_estimator = "mse"
[teacher]
path = "teacher"
[output]
dir = "out"
save_freq = 5
[validation]
dir = "val"
"#;

/// `text` parsed as a value of `like`'s type (a TOML table: this crate does not name `toml`).
fn parse_as<T: std::str::FromStr>(_like: &T, text: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    text.parse().unwrap()
}

/// Every old form above, as (file name, text, run).
fn legacy_configs() -> Vec<(&'static str, String, RunKind)> {
    vec![
        ("pretrain.toml", LEGACY_PRETRAIN.to_string(), RunKind::Pretrain),
        (
            "pretrain_min_lr.toml",
            LEGACY_PRETRAIN.replace("schedule = \"cosine_then_floor\"", "schedule = \"cosine_with_min_lr\"\nmin_lr = 1e-5").replace("decay_steps = 80\nfloor_lr = 1e-5\n", ""),
            RunKind::Pretrain,
        ),
        (
            "pretrain_min_lr_rate.toml",
            LEGACY_PRETRAIN
                .replace("schedule = \"cosine_then_floor\"", "schedule = \"cosine_with_min_lr\"\nmin_lr_rate = 0.1\nwarmup_ratio = 0.05")
                .replace("warmup_steps = 5\ndecay_steps = 80\nfloor_lr = 1e-5\n", ""),
            RunKind::Pretrain,
        ),
        ("sft.toml", LEGACY_SFT.to_string(), RunKind::Sft),
        ("rl.toml", LEGACY_RL.to_string(), RunKind::Rl),
        ("rl_kl.toml", LEGACY_RL.replace("low_var_kl", "kl").replace("dir = \"prompts\"", "files = [\"p.jsonl\"]").replace("ops = [11, 12]\n", ""), RunKind::Rl),
        ("opd.toml", LEGACY_OPD.to_string(), RunKind::Opd),
    ]
}

#[test]
fn upgrade_rewrites_every_legacy_form_to_the_same_effective_config() {
    let tmp = tempfile::tempdir().unwrap();
    let mut notes = std::collections::BTreeSet::new();
    for (name, text, kind) in legacy_configs() {
        let path = tmp.path().join(name);
        std::fs::write(&path, &text).unwrap();
        let upgraded = config_import::upgrade::upgrade(&path, &text, None).unwrap();
        assert_eq!(upgraded.kind, kind, "{name}");
        assert!(!upgraded.notes.is_empty(), "{name}: the input is legacy");
        notes.extend(upgraded.notes.iter().cloned());
        // Next to the original (paths are relative to the file): the same effective config ...
        let new_path = tmp.path().join(format!("new_{name}"));
        std::fs::write(&new_path, &upgraded.text).unwrap();
        let before = config_import::effective(&path, &text, kind).unwrap();
        let after = config_import::effective(&new_path, &upgraded.text, kind).unwrap();
        assert_eq!(before, after, "{name}:\n{}", upgraded.text);
        // ... with no legacy form left: no note, and nothing for the loader to move.
        assert!(config_import::legacy_notes(&upgraded.text, kind).is_empty(), "{name}:\n{}", upgraded.text);
        let family = if matches!(kind, RunKind::Pretrain | RunKind::Sft) { Family::NextToken } else { Family::PolicyGradient };
        let migrated = migrated_table(&new_path, &upgraded.text, family).unwrap();
        assert_eq!(migrated, parse_as(&migrated, &upgraded.text), "{name}");
        // Upgrading again changes nothing.
        let again = config_import::upgrade::upgrade(&new_path, &upgraded.text, Some(kind)).unwrap();
        assert!(again.notes.is_empty(), "{name}: {:?}", again.notes);
        assert_eq!(again.text.lines().skip(3).collect::<Vec<_>>(), upgraded.text.lines().skip(3).collect::<Vec<_>>(), "{name}");
        // Only the values the file gives: no section or key it leaves to the defaults.
        for absent in ["[rollout]", "\nn = ", "batch_size", "precision", "recompute", "typo", "cutoff_len", "clip_ratio"] {
            assert!(!upgraded.text.contains(absent), "{name}: a default ({absent:?}) was written:\n{}", upgraded.text);
        }
        assert!(upgraded.text.lines().next().unwrap().contains("kiln config upgrade") && upgraded.text.contains("comments are not carried over"), "{}", upgraded.text);
    }
    // The old forms of the loader's table, each met (as `kiln config show` names them).
    for note in [
        "[train] lr is read as [optimizer] lr",
        "[train] weight_decay is read as [optimizer] weight_decay",
        "[train] max_grad_norm is read as [optimizer] max_grad_norm",
        "[train] beta1 is read as [optimizer] beta1",
        "[train] beta2 is read as [optimizer] beta2",
        "[train] eps is read as [optimizer] eps",
        "[train] schedule is read as [schedule] kind",
        "[train] warmup_ratio is read as [schedule] warmup_ratio",
        "[train] warmup_steps is read as [schedule] warmup_steps",
        "[train] min_lr is read as [schedule] min_lr",
        "[train] min_lr_rate is read as [schedule] min_lr_rate",
        "[train] decay_steps is read as [schedule] decay_steps",
        "[train] floor_lr is read as [schedule] floor_lr",
        "[train] min_lr_ratio is read as [schedule] min_lr_rate",
        "[validation] is read as [eval]",
        "[validation] dir is read as [eval] rows",
        "[data] interplay (no kind) is read as [data] kind = \"mixture\", root",
        "[data] sft (no kind) is read as [data] kind = \"sft\", path",
        "[data] dir (no kind) is read as [data] kind = \"prompts\", dir",
        "[data] files (no kind) is read as [data] kind = \"prompts\", files",
        "[eval] heldout is read as [eval] rows",
        "[eval] accuracy_ops is read as [eval] ops",
        "[eval] accuracy_rows is read as [eval] rows_per_op",
        "[data] sft_columns is read as [data] columns",
        "[data] sft_heldout is read as [data] heldout",
        "[data] sft_split_key is read as [data] split_key",
        "[output] save_freq is read as [output] save_steps",
        "[loss] loss_agg_mode is read as [loss] agg",
        "[loss] kl_estimator = \"low_var_kl\" is read as kl_estimator = \"k3\"",
        "[loss] kl_estimator = \"kl\" is read as kl_estimator = \"k1\"",
        "[loss] kl_estimator = \"mse\" is read as kl_estimator = \"k2\"",
    ] {
        assert!(notes.contains(note), "not covered: {note}; met: {notes:#?}");
    }
    // rl's old cosine decays to min_lr_ratio x lr (0 when absent): written out explicitly.
    let rl = config_import::upgrade::upgrade(&tmp.path().join("x.toml"), LEGACY_OPD, None).unwrap().text;
    assert!(rl.contains("kind = \"cosine_with_min_lr\"") && rl.contains("min_lr_rate = 0.0"), "{rl}");
}

#[test]
fn upgrade_through_the_binary_never_overwrites_without_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("rl.toml");
    std::fs::write(&file, LEGACY_RL).unwrap();
    let f = file.to_str().unwrap();
    // To stdout: the file untouched, the old forms named on stderr.
    let out = kiln(&["config", "upgrade", f]);
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("[train] lr is read as [optimizer] lr") && stdout.contains("[optimizer]\nlr = "), "{stderr}\n{stdout}");
    assert!(stdout.ends_with('\n'), "a text file ends with a newline: {stdout:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), LEGACY_RL);
    // --out: an existing file is refused (one line), a new one written.
    let existing = tmp.path().join("existing.toml");
    std::fs::write(&existing, "keep").unwrap();
    let out = kiln(&["config", "upgrade", f, "--out", existing.to_str().unwrap()]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && stderr.lines().filter(|l| l.starts_with("error:")).count() == 1 && stderr.contains("never overwrites"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep");
    let new = tmp.path().join("new.toml");
    assert!(kiln(&["config", "upgrade", f, "--out", new.to_str().unwrap()]).status.success());
    assert_eq!(std::fs::read_to_string(&new).unwrap(), stdout);
    // --in-place: the original kept as FILE.bak.
    let out = kiln(&["config", "upgrade", f, "--in-place"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), stdout);
    assert_eq!(std::fs::read_to_string(tmp.path().join("rl.toml.bak")).unwrap(), LEGACY_RL);
    // Again: already current, left as it is; a legacy file whose .bak exists is refused.
    let out = kiln(&["config", "upgrade", f, "--in-place"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains("already in the current schema"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), stdout);
    std::fs::write(&file, LEGACY_RL).unwrap();
    let out = kiln(&["config", "upgrade", f, "--in-place"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("rl.toml.bak exists"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), LEGACY_RL);
    assert!(!kiln(&["config", "upgrade", f, "--in-place", "--out", new.to_str().unwrap()]).status.success(), "--in-place and --out conflict");
    // Through a symbolic link: the file it names is upgraded, the link kept.
    let real = tmp.path().join("real.toml");
    std::fs::write(&real, LEGACY_RL).unwrap();
    let link = tmp.path().join("link.toml");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = kiln(&["config", "upgrade", link.to_str().unwrap(), "--in-place"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(link.symlink_metadata().unwrap().file_type().is_symlink(), "the link is kept");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), stdout.replacen("# rl.toml,", "# link.toml,", 1), "(its header names the file given)");
    assert_eq!(std::fs::read_to_string(tmp.path().join("link.toml.bak")).unwrap(), LEGACY_RL);
}

#[test]
fn committed_examples_are_in_the_current_schema_and_read_as_before() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/configs");
    let legacy = fixture("config/legacy_examples");
    let mut compared = Vec::new();
    for path in example_configs() {
        if path.ends_with("release/release.toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let kind = config_import::detect_kind(&path, &text).unwrap();
        // No legacy form: nothing named, nothing for the loader to move.
        assert!(config_import::legacy_notes(&text, kind).is_empty(), "{}: {:?}", path.display(), config_import::legacy_notes(&text, kind));
        let family = if matches!(kind, RunKind::Pretrain | RunKind::Sft) { Family::NextToken } else { Family::PolicyGradient };
        let migrated = migrated_table(&path, &text, family).unwrap();
        assert_eq!(migrated, parse_as(&migrated, &text), "{}", path.display());
        // The text committed before (a fixture, legacy) reads to exactly the same config.
        let old = legacy.join(path.strip_prefix(&examples).unwrap());
        if let Ok(old_text) = std::fs::read_to_string(&old) {
            assert!(!config_import::legacy_notes(&old_text, kind).is_empty(), "{}: the fixture is the legacy text", old.display());
            let before = config_import::effective(&old, &old_text, kind).unwrap();
            assert_eq!(before, config_import::effective(&path, &text, kind).unwrap(), "{}", path.display());
            compared.push(old);
        }
    }
    // Every fixture has its example.
    assert_eq!(compared.len(), 10, "{compared:?}");
}

#[test]
fn a_section_of_another_run_is_refused_at_load_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let sft = "[model]\nfrom = \"m\"\n[data]\nkind = \"sft\"\npath = \"rows.jsonl\"\n[train]\nsteps = 1\nmicro_batch = 1\n[optimizer]\nlr = 1e-5\n[output]\ndir = \"out\"\n[rollout]\nn = 4\n";
    let grpo = "[model]\nfrom = \"m\"\n[data]\nkind = \"prompts\"\ndir = \"p\"\n[train]\nsteps = 1\n[output]\ndir = \"out\"\n[teacher]\npath = \"t\"\n";
    for (command, text, expected) in [
        ("sft", sft, "line 13: [rollout] is for `kiln rl` and `kiln opd`"),
        ("rl", grpo, "line 10: [teacher] is for `kiln opd`"),
    ] {
        let path = tmp.path().join(format!("{command}.toml"));
        std::fs::write(&path, text).unwrap();
        // Before any model, data or device is touched: one line naming the file and the line.
        let out = kiln(&[command, "--config", path.to_str().unwrap()]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
        assert!(stderr.starts_with(&format!("error: {} {expected}", path.display())), "{stderr}");
        // `kiln config show` and `upgrade` refuse it the same way.
        let out = kiln(&["config", "upgrade", path.to_str().unwrap(), "--kind", command]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains(expected), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A run whose config uses earlier names prints one note line with its data line, once it has
/// started (`cli::config::legacy_note`, unit-tested there); a run refused before that still ends
/// in its one error line, whichever names its config uses.
#[test]
fn a_refused_run_with_earlier_names_is_one_error_line() {
    let tmp = tempfile::tempdir().unwrap();
    let legacy = tmp.path().join("legacy.toml");
    std::fs::write(&legacy, LEGACY_PRETRAIN).unwrap();
    let upgraded = tmp.path().join("current.toml");
    assert!(kiln(&["config", "upgrade", legacy.to_str().unwrap(), "--out", upgraded.to_str().unwrap()]).status.success());
    for config in [&legacy, &upgraded] {
        let out = kiln(&["pretrain", "--config", config.to_str().unwrap()]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error:"), "{stderr}");
    }
}
