//! Every config form users already have still reads to the same values: the committed example
//! configs and the TOML templates that `kiln quickstart` and the examples write (read out of
//! their source files, so that a template that stops parsing fails here), each also written in
//! the new form, which must read to the same config.

use std::path::{Path, PathBuf};

use crate::rl::{Method, PgConfig};
use crate::rl::loss::{KlEstimator, LossAgg};
use crate::train::adamw::AdamWConfig;
use crate::train::config::{DataSection, MixtureData, OutputSection, SftData, TokenCount, Typo};
use crate::train::run::{RunConfig, Sections, loop_config};
use crate::train::schedule::{Decay, Schedule};
use crate::train::trainer::{LoopConfig, SavePolicy};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The raw string literal that follows `marker` in the source file `rel`, with `format!`'s
/// placeholders replaced by `values` (`{name}`, `{name:?}`, `{name:e}`) and `{{ }}` unescaped.
fn template(rel: &str, marker: &str, values: &[(&str, &str)]) -> String {
    let source = std::fs::read_to_string(repo(rel)).unwrap();
    let from = source.find(marker).unwrap_or_else(|| panic!("{marker:?} not in {rel}"));
    let start = from + source[from..].find("r#\"").unwrap() + 3;
    let end = start + source[start..].find("\"#").unwrap();
    let mut text = source[start..end].to_owned();
    for (name, value) in values {
        for form in [format!("{{{name}}}"), format!("{{{name}:?}}"), format!("{{{name}:e}}")] {
            text = text.replace(&form, value);
        }
    }
    assert!(!text.replace("{{", "").contains('{'), "a placeholder of {rel} is not filled: {text}");
    text.replace("{{", "{").replace("}}", "}")
}

fn run_config(text: &str) -> RunConfig {
    RunConfig::from_toml(Path::new("/work/run.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn pg_config(text: &str) -> PgConfig {
    PgConfig::from_toml(Path::new("/work/run.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The loop settings a next-token config gives a run of `total` steps.
fn next_token_loop(config: &RunConfig, total: u64) -> LoopConfig {
    let sections = Sections { optimizer: &config.optimizer, schedule: &config.schedule, output: &config.output };
    loop_config(sections, total, config.eval.every, None, serde_json::Value::Null).unwrap()
}

fn pg_loop(config: &PgConfig, total: u64) -> LoopConfig {
    let sections = Sections { optimizer: &config.optimizer, schedule: &config.schedule, output: &config.output };
    loop_config(sections, total, None, None, serde_json::Value::Null).unwrap()
}

fn adamw(lr: f64, weight_decay: f64) -> AdamWConfig {
    AdamWConfig { lr, weight_decay, ..AdamWConfig::default() }
}

#[test]
fn the_quickstart_template_reads_as_before_and_as_its_new_form() {
    let old = run_config(&template("src/cli/quickstart.rs", "fn pretrain_toml", &[("steps", "150"), ("budget", "360"), ("every", "37")]));
    let new = run_config(
        r#"
[model]
init = "model/config.json"
seed = 0

[data]
kind = "mixture"
root = "data"
ops = [2, 3, 4]
probs = [0.3, 0.3, 0.4]
tokens = 1e6
cutoff_len = 512

[train]
steps = 150
micro_batch = 8
seed = 42

[optimizer]
lr = 3e-3
weight_decay = 0.1

[schedule]
kind = "cosine_with_min_lr"
min_lr_rate = 0.5
warmup_ratio = 0.05

[output]
dir = "release/pretrain"
save_steps = 0.2
time_budget_s = 360

[eval]
every = 37
rows = "data/val"
ops = [2, 3]
rows_per_op = 20
"#,
    );
    assert_eq!(old, new);
    assert_eq!(old.model.init.as_deref(), Some(Path::new("/work/model/config.json")));
    let DataSection::Mixture(MixtureData { root, ops, probs, tokens, cutoff_len, typo, .. }) = &old.data else { panic!("{:?}", old.data) };
    assert_eq!((root.as_path(), ops.as_deref(), probs.as_deref()), (Path::new("/work/data"), Some(&[2, 3, 4][..]), Some(&[0.3, 0.3, 0.4][..])));
    assert_eq!((tokens, *cutoff_len, *typo), (&Some(TokenCount::Number(1e6)), 512, Typo::Reproduce));
    assert_eq!((old.train.steps, old.train.micro_batch, old.train.grad_accum, old.train.seed), (Some(150), 8, 1, 42));
    let l = next_token_loop(&old, 150);
    assert_eq!(l.schedule, Schedule { warmup_steps: 8, total_steps: 150, decay: Decay::CosineWithMinLr { min_lr_rate: 0.5 } });
    assert_eq!(l.optimizer, adamw(3e-3, 0.1));
    assert_eq!(l.save, SavePolicy { every: Some(0.2), ..SavePolicy::default() });
    assert_eq!((l.eval_every, l.time_budget.map(|t| t.as_secs())), (Some(37), Some(360)));
    assert_eq!(old.eval.rows.as_deref(), Some(Path::new("/work/data/val")));
    assert_eq!((old.eval.ops.as_slice(), old.eval.rows_per_op, old.eval.max_new_tokens), (&[2, 3][..], 20, 320));
}

#[test]
fn the_example_templates_read_as_before() {
    // examples/rl.rs: pre-training (no seed or weight-decay defaults given: 42 and 0 apply).
    let pretrain = run_config(&template("examples/rl.rs", "fn pretrain(", &[("steps", "200")]));
    let l = next_token_loop(&pretrain, 200);
    assert_eq!(l.schedule, Schedule { warmup_steps: 10, total_steps: 200, decay: Decay::CosineWithMinLr { min_lr_rate: 0.1 } });
    assert_eq!((l.optimizer, l.save.every), (adamw(3e-3, 0.1), Some(0.5)));
    assert!(matches!(&pretrain.data, DataSection::Mixture(m) if m.tokens == Some(TokenCount::Number(2e6)) && m.cutoff_len == 512));

    // examples/finetune.rs: SFT with a linear-free cosine floor, weight decay 0 by default.
    let sft = run_config(&template("examples/finetune.rs", "let run_toml", &[("steps", "60")]));
    let l = next_token_loop(&sft, 60);
    assert_eq!(l.schedule, Schedule { warmup_steps: 3, total_steps: 60, decay: Decay::CosineWithMinLr { min_lr_rate: 0.1 } });
    assert_eq!(l.optimizer, adamw(3e-3, 0.0));
    let DataSection::Sft(SftData { path, max_length, system_prompt, cutoff_len, columns, heldout, split_key, neat_packing, chat_template, eos_token }) = &sft.data else { panic!("{:?}", sft.data) };
    assert_eq!((path.as_path(), *max_length, system_prompt, *cutoff_len), (Path::new("/work/sft.jsonl"), Some(192), &None, 2048));
    assert_eq!((columns, heldout, split_key, *neat_packing, chat_template, eos_token), (&None, &None, &None, false, &None, &None));
    assert_eq!(sft.model.from.as_deref(), Some(Path::new("/work/init/model")));

    // examples/rl.rs and examples/opd.rs: GRPO and OPD with verl's defaults for the rest.
    let rl = pg_config(&template("examples/rl.rs", "fn rl_toml", &[("base", "\"/base\""), ("steps", "30"), ("lr", "1e-4")]));
    let opd = pg_config(&template(
        "examples/opd.rs",
        "fn opd_toml",
        &[("student", "\"/student\""), ("teacher", "\"/teacher\""), ("steps", "30"), ("lr", "1e-4")],
    ));
    for config in [&rl, &opd] {
        let l = pg_loop(config, 30);
        assert_eq!(l.schedule, Schedule { warmup_steps: 0, total_steps: 30, decay: Decay::Constant });
        assert_eq!(l.optimizer, adamw(1e-4, 0.01));
        assert_eq!(l.save.every, Some(10.0));
        let eval = config.eval.as_ref().unwrap();
        assert_eq!((eval.rows.as_path(), eval.every, eval.id_max_op), (Path::new("/work/data/val"), 10, Some(4)));
        let prompts = config.prompts().unwrap();
        assert_eq!((prompts.dir.as_deref(), prompts.ops.as_slice(), prompts.max_prompt_length, prompts.seed), (Some(Path::new("/work/data/heldout")), &[3, 4, 5][..], 512, 1));
        let s = config.settings();
        assert_eq!((s.prompts_per_step, s.mini_batch, s.micro_batch, s.rollout.max_response_length), (8, 4, 16, 256));
        assert_eq!(s.kl, Some((KlEstimator::K3, 0.001)));
    }
    assert_eq!(rl.output.name.as_deref(), Some("op3_5"));
    assert_eq!((rl.settings().rollout.n, opd.settings().rollout.n), (8, 4));
    assert_eq!(opd.teacher.as_ref().unwrap().path, Path::new("/teacher"));
}

#[test]
fn the_committed_rl_config_reads_as_its_new_form() {
    // As committed before the examples were upgraded (examples/configs/rl_op11_14.toml).
    let path = repo("tests/fixtures/config/legacy_examples/rl_op11_14.toml");
    let old = PgConfig::from_toml(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
    let new_text = r#"
[model]
from = "../../020305/pretrain/checkpoint-18809"

[data]
kind = "prompts"
dir = "../../data/composition/heldout"
ops = [11, 12, 13, 14]
max_prompt_length = 1024
seed = 1

[rollout]
n = 6
temperature = 1.0
top_p = 1.0
top_k = 0
max_response_length = 1024

[train]
epochs = 1
prompts_per_step = 1024
mini_batch = 256
micro_batch = 16

[optimizer]
lr = 1e-6
weight_decay = 0.01
max_grad_norm = 1.0

[schedule]
kind = "constant"

[loss]
clip_ratio = 0.2
clip_ratio_c = 3.0
agg = "token-mean"
kl_coef = 0.001
kl_estimator = "low_var_kl"
reward_scaling = "group"

[reward]
kind = "outcome"

[output]
dir = "../../020305/rl"
name = "op11_14"
save_steps = 20

[eval]
rows = "../../data/composition/val"
every = 20
id_max_op = 10
"#;
    let new = PgConfig::from_toml(&path, new_text).unwrap();
    assert_eq!(old, new);
    let l = pg_loop(&old, 195);
    assert_eq!(l.schedule, Schedule { warmup_steps: 0, total_steps: 195, decay: Decay::Constant });
    assert_eq!((l.optimizer, l.save.every, l.save.run_name.as_deref()), (adamw(1e-6, 0.01), Some(20.0), Some("op11_14")));
    assert_eq!(old.settings().agg, LossAgg::TokenMean);
    // No KV memory bound unless given (GiB, then bytes for the engine).
    assert_eq!(old.settings().rollout.kv_memory, None);
    let bounded = PgConfig::from_toml(&path, &new_text.replace("max_response_length = 1024\n", "max_response_length = 1024\nkv_memory = 1.5\n")).unwrap();
    assert_eq!(bounded.settings().rollout.kv_memory, Some(3 << 29));
    // Prefill passes of 8,192 tokens unless given; 0 is refused.
    assert_eq!(old.settings().rollout.max_prefill_tokens, 8192);
    let prefill = |n: &str| PgConfig::from_toml(&path, &new_text.replace("max_response_length = 1024\n", &format!("max_response_length = 1024\nmax_prefill_tokens = {n}\n")));
    assert_eq!(prefill("2048").unwrap().settings().rollout.max_prefill_tokens, 2048);
    let err = prefill("0").unwrap_err().to_string();
    assert!(err.contains("[rollout] max_prefill_tokens must be at least 1"), "{err}");

    // The OPD config leaves the optimizer, schedule and validation to the defaults.
    let path = repo("examples/configs/opd_refkl_op11_14.toml");
    let opd = PgConfig::from_toml(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
    let l = pg_loop(&opd, 200);
    assert_eq!((l.schedule, l.optimizer.lr), (Schedule { warmup_steps: 0, total_steps: 200, decay: Decay::Constant }, 1e-6));
    assert_eq!(opd.eval.as_ref().map(|e| (e.every, e.id_max_op)), Some((20, None)), "every 20 by default; the task's own split");
}

#[test]
fn an_old_rl_cosine_keeps_its_floor() {
    let base = "[model]\nfrom = \"m\"\n[data]\nfiles = [\"a.jsonl\"]\n[output]\ndir = \"o\"\n[train]\nsteps = 10\nlr = 1e-5\n";
    let schedule = |extra: &str| pg_loop(&pg_config(&format!("{base}{extra}")), 10).schedule.decay;
    assert_eq!(schedule("schedule = \"cosine\"\nmin_lr_ratio = 0.1\n"), Decay::CosineWithMinLr { min_lr_rate: 0.1 });
    assert_eq!(schedule("schedule = \"cosine\"\n"), Decay::CosineWithMinLr { min_lr_rate: 0.0 });
    assert_eq!(schedule("schedule = \"constant\"\n"), Decay::Constant);
    // The new form of a pre-training config's cosine is HF's cosine, in rl configs too.
    assert_eq!(schedule("[schedule]\nkind = \"cosine\"\n"), Decay::Cosine);
}

#[test]
fn errors_name_the_file_and_the_line() {
    let path = Path::new("/work/bad.toml");
    let good = "[model]\ninit = \"c.json\"\n\n[data]\nsft = \"s.jsonl\"\n\n[train]\nsteps = 3\nmicro_batch = 2\nlr = 1e-3\n\n[output]\ndir = \"o\"\n";
    run_config(good);
    let cases = [
        // A moved key keeps its line for type errors ...
        (good.replace("lr = 1e-3", "lr = \"fast\""), "bad.toml line 10: invalid type: string \"fast\""),
        // ... and for being given in both places.
        (format!("{good}\n[optimizer]\nlr = 2e-3\n"), "bad.toml line 10: [train] lr is the old place of [optimizer] lr"),
        (good.replace("sft = \"s.jsonl\"", "sft = \"s.jsonl\"\ninterplay = \"d\""), "bad.toml line 5: [data] needs exactly one of"),
        (good.replace("micro_batch = 2", "micro_batch = 2\nprecison = \"bf16\""), "bad.toml line 10: unknown field `precison`"),
        (format!("{good}\n[schedule]\nkind = \"cosin\"\n"), "unknown variant `cosin`"),
        (good.replace("lr = 1e-3\n", ""), "bad.toml: [optimizer] needs `lr`"),
        (good.replace("sft = \"s.jsonl\"", "dir = \"d\""), "bad.toml line 5: [data] kind = \"prompts\" is for `kiln rl`"),
        (format!("{good}\n[eval]\nrows = \"v\"\n\n[validation]\ndir = \"v\"\n"), "bad.toml line 18: [validation] is the old name of [eval]"),
    ];
    for (text, expected) in cases {
        let e = RunConfig::from_toml(path, &text).unwrap_err().to_string();
        assert!(e.starts_with("/work/bad.toml") && e.contains(expected), "{e}\nexpected: {expected}\n{text}");
    }
    let e = PgConfig::from_toml(path, good).unwrap_err().to_string();
    assert!(e.contains("[model] needs `from`"), "{e}");
}

#[test]
fn precision_recompute_and_rollout_dtype_are_read() {
    let sft = |train: &str, model: &str| {
        format!("[model]\nfrom = \"m\"\n{model}\n[data]\nkind = \"sft\"\npath = \"rows.jsonl\"\n[train]\nsteps = 1\nmicro_batch = 1\n{train}\n[optimizer]\nlr = 1e-5\n[output]\ndir = \"out\"\n")
    };
    let default = run_config(&sft("", ""));
    assert_eq!((default.train.precision, default.train.recompute), (crate::train::Precision::F32, false));
    let config = run_config(&sft("precision = \"bf16-mixed\"\nrecompute = true", ""));
    assert_eq!((config.train.precision, config.train.recompute), (crate::train::Precision::Bf16Mixed, true));
    let err = RunConfig::from_toml(Path::new("/work/run.toml"), &sft("precision = \"bf16\"", "")).unwrap_err().to_string();
    assert!(err.contains("run.toml line 10") && err.contains("bf16-mixed"), "{err}");
    let err = RunConfig::from_toml(Path::new("/work/run.toml"), &sft("", "dtype = \"bf16\"")).unwrap_err().to_string();
    assert!(err.contains("[train] precision"), "{err}");

    let rl = pg_config(
        "[model]\nfrom = \"m\"\ndtype = \"bf16\"\n[data]\nkind = \"prompts\"\ndir = \"p\"\n[train]\nsteps = 1\nprecision = \"bf16-pure\"\n[output]\ndir = \"out\"\n",
    );
    assert_eq!((rl.settings().rollout.dtype, rl.train.precision), (Some(crate::model::Dtype::BF16), crate::train::Precision::Bf16Pure));
}

#[test]
fn settings_of_another_run_family_are_refused_at_load_naming_the_line() {
    let path = Path::new("/work/run.toml");
    let sft = "[model]\nfrom = \"m\"\n[data]\nkind = \"sft\"\npath = \"rows.jsonl\"\n[train]\nsteps = 1\nmicro_batch = 1\n[optimizer]\nlr = 1e-5\n[output]\ndir = \"out\"\n";
    run_config(sft);
    let next_token = [
        (format!("{sft}[rollout]\nn = 4\n"), "line 13: [rollout] is for `kiln rl` and `kiln opd`"),
        (format!("{sft}[loss]\nkl_coef = 0.0\n"), "line 13: [loss] is for `kiln rl` and `kiln opd`"),
        (format!("{sft}[reward]\nkind = \"outcome\"\n"), "line 13: [reward] is for `kiln rl` and `kiln opd`"),
        (format!("{sft}[teacher]\npath = \"t\"\n"), "line 13: [teacher] is for `kiln rl` and `kiln opd`"),
        (sft.replace("micro_batch = 1", "micro_batch = 1\nprompts_per_step = 4"), "line 9: [train] prompts_per_step is for `kiln rl`"),
        (sft.replace("micro_batch = 1", "micro_batch = 1\nmini_batch = 4"), "line 9: [train] mini_batch is for `kiln rl`"),
        (sft.replace("from = \"m\"", "from = \"m\"\ndtype = \"bf16\""), "line 3: [model] dtype is for rl and opd"),
        (format!("{sft}[eval]\nrows = \"v\"\nid_max_op = 10\n"), "line 15: [eval] id_max_op is for `kiln rl`"),
        (sft.replace("kind = \"sft\"\npath = \"rows.jsonl\"", "files = [\"p.jsonl\"]"), "line 4: [data] kind = \"prompts\" is for `kiln rl`"),
    ];
    for (text, expected) in next_token {
        let e = RunConfig::from_toml(path, &text).unwrap_err().to_string();
        assert!(e.starts_with("/work/run.toml ") && e.contains(expected), "{e}\nexpected: {expected}\n{text}");
    }

    let rl = "[model]\nfrom = \"m\"\n[data]\nkind = \"prompts\"\ndir = \"p\"\n[train]\nsteps = 1\n[output]\ndir = \"out\"\n";
    pg_config(rl);
    let opd = format!("{rl}[teacher]\npath = \"t\"\n");
    let policy_gradient = [
        (rl.replace("steps = 1", "steps = 1\ngrad_accum = 2"), None, "line 8: [train] grad_accum is for `kiln pretrain`"),
        (rl.replace("steps = 1", "steps = 1\nseed = 3"), None, "line 8: [train] seed is for `kiln pretrain` and `kiln sft`"),
        (rl.replace("from = \"m\"", "init = \"c.json\""), None, "line 2: [model] needs `from` (the policy's starting point), not `init`"),
        (rl.replace("kind = \"prompts\"\ndir = \"p\"", "kind = \"sft\"\npath = \"p\""), None, "line 4: [data] kind = \"sft\" is not for `kiln rl`"),
        // A legacy form keeps its line: `sft = …` implies kind = "sft".
        (rl.replace("kind = \"prompts\"\ndir = \"p\"", "sft = \"p\""), None, "line 4: [data] kind = \"sft\" is not for `kiln rl`"),
        (opd.clone(), Some(Method::Grpo), "line 10: [teacher] is for `kiln opd`"),
        (format!("{opd}[reward]\nkind = \"outcome\"\n"), Some(Method::Opd), "line 12: [reward] is for `kiln rl`"),
        (rl.to_string(), Some(Method::Opd), "run.toml: on-policy distillation (`kiln opd`) needs a [teacher]"),
    ];
    for (text, method, expected) in policy_gradient {
        let e = match method {
            Some(method) => PgConfig::load(path, &text, method),
            None => PgConfig::from_toml(path, &text),
        }
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("/work/run.toml") && e.contains(expected), "{e}\nexpected: {expected}\n{text}");
    }
    // Each method's own sections load.
    PgConfig::load(path, &opd, Method::Opd).unwrap();
    PgConfig::load(path, &format!("{rl}[reward]\nkind = \"outcome\"\n"), Method::Grpo).unwrap();
}

#[test]
fn the_optimizer_section_is_what_adamw_takes() {
    let text = "[model]\nfrom = \"m\"\n[data]\nkind = \"sft\"\npath = \"r.jsonl\"\n[train]\nsteps = 10\nmicro_batch = 1\n[optimizer]\nlr = 3e-4\nweight_decay = 0.1\nmax_grad_norm = 0.5\nbeta1 = 0.8\nbeta2 = 0.95\neps = 1e-6\n[output]\ndir = \"o\"\n";
    let config = run_config(text);
    // `[optimizer]` is read straight into AdamW's settings, the learning rate included ...
    let expected = AdamWConfig { lr: 3e-4, beta1: 0.8, beta2: 0.95, eps: 1e-6, weight_decay: 0.1, max_grad_norm: Some(0.5) };
    assert_eq!(config.optimizer, expected);
    // ... which the loop takes as they are; the schedule is the rate's shape.
    let l = next_token_loop(&config, 10);
    assert_eq!((l.optimizer, l.schedule.decay), (expected, Decay::Linear));
    assert_eq!((l.schedule.lr(l.optimizer.lr, 0), l.schedule.lr(l.optimizer.lr, 5)), (3e-4, 1.5e-4));
    // The family's defaults fill what a file leaves out: rl's lr and weight decay; pretrain and
    // sft need an lr.
    let rl = pg_config("[model]\nfrom = \"m\"\n[data]\nkind = \"prompts\"\ndir = \"p\"\n[train]\nsteps = 1\n[output]\ndir = \"o\"\n");
    assert_eq!((rl.optimizer, pg_loop(&rl, 5).schedule.decay), (adamw(1e-6, 0.01), Decay::Constant));
    let err = RunConfig::from_toml(Path::new("/work/run.toml"), &text.replace("lr = 3e-4\n", "")).unwrap_err().to_string();
    assert!(err.starts_with("/work/run.toml line 9: [optimizer] needs `lr`"), "{err}");
    // torch.optim.AdamW's ranges, named at the key's line: a beta of 1 divides by zero in the
    // bias correction, a NaN turns every weight NaN.
    for (from, to, message) in [
        ("beta2 = 0.95", "beta2 = 1.0", "line 14: [optimizer] beta2 must be in [0, 1) (got 1)"),
        ("eps = 1e-6", "eps = nan", "line 15: [optimizer] eps must be a finite number >= 0 (got NaN)"),
        ("weight_decay = 0.1", "weight_decay = -0.1", "line 11: [optimizer] weight_decay must be a finite number >= 0"),
        ("max_grad_norm = 0.5", "max_grad_norm = nan", "line 12: [optimizer] max_grad_norm must be a number"),
        ("steps = 10", "steps = 0", "[train] steps must be at least 1"),
        ("[output]", "[schedule]\nkind = \"cosine_with_min_lr\"\nmin_lr_rate = -1.0\n[output]", "[schedule] min_lr_rate must be a finite number >= 0 (got -1)"),
        ("[output]", "[schedule]\nkind = \"cosine_then_floor\"\nfloor_lr = inf\n[output]", "[schedule] floor_lr must be a finite number >= 0 (got inf)"),
    ] {
        let err = RunConfig::from_toml(Path::new("/work/run.toml"), &text.replace(from, to)).unwrap_err().to_string();
        assert!(err.starts_with("/work/run.toml") && err.contains(message), "{err}");
    }
    // min_lr over an lr of 0 would be a NaN rate.
    let nan_rate = text.replace("lr = 3e-4", "lr = 0.0").replace("[output]", "[schedule]\nkind = \"cosine_with_min_lr\"\nmin_lr = 1e-5\n[output]");
    let err = RunConfig::from_toml(Path::new("/work/run.toml"), &nan_rate).unwrap_err().to_string();
    assert!(err.contains("[schedule] min_lr must be a finite number >= 0, and [optimizer] lr positive"), "{err}");
}

#[test]
fn output_save_steps_and_names_that_runs_can_use() {
    let output = |name: Option<&str>, save_steps: Option<f64>| OutputSection { name: name.map(str::to_owned), save_steps, ..OutputSection::default() };
    // Whole steps, fractions of the run, and 0 or less (TRL's save_strategy "no", verl's -1).
    for every in [None, Some(20.0), Some(0.2), Some(1.0), Some(0.0), Some(-1.0), Some(1e300)] {
        assert!(output(Some("op11_14"), every).check().is_ok(), "{every:?}");
    }
    for every in [1.5, 20.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let e = output(None, Some(every)).check().unwrap_err();
        assert_eq!(e.key, Some("save_steps"), "{every}");
    }
    for name in ["", "..", "a.b"] {
        assert!(output(Some(name), None).check().is_ok(), "{name:?}");
    }
    for name in ["a/b", "../x", "/abs"] {
        assert!(output(Some(name), None).check().is_err_and(|e| e.key == Some("name") && e.message.contains("plain name")), "{name:?}");
    }
}
