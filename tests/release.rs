//! The Interplay release recipe (`examples/configs/release/`, `kiln release run`): every config
//! parses and carries the release's numbers (docs/release-layout.md, docs/interplay.md §2.6,
//! §5, §6.1, §7, §8.1), and the `tiny` scale runs end to end through the binary, resumes, and
//! skips what is finished.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::data::mixture::{Preset, TypoPolicy, readable_to_number};
use kiln::release::config::EvalModels;
use kiln::release::{FULL, Plan, PlannedRun, ReleaseConfig, RunKind, RunSpec};
use kiln::rl::PgConfig;
use kiln::rl::loss::KlEstimator;
use kiln::tasks::RewardConfig;
use kiln::train::RunConfig;
use kiln::train::config::{DataSection, ScheduleKind, TokenCount, Typo};
use serde_json::Value;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn release_file() -> PathBuf {
    repo("examples/configs/release/release.toml")
}

fn release() -> ReleaseConfig {
    ReleaseConfig::load(&release_file()).unwrap()
}

fn full_plan() -> Plan {
    kiln::release::plan(&release(), &release_file(), FULL, None).unwrap()
}

fn run<'a>(plan: &'a Plan, batch: &str, name: &str) -> &'a PlannedRun {
    plan.runs.iter().find(|r| r.batch == batch && r.name == name).unwrap_or_else(|| panic!("no run {batch} {name}"))
}

fn pretrain(run: &PlannedRun) -> &RunConfig {
    match &run.spec {
        RunSpec::Pretrain(c) => c,
        RunSpec::Pg(_) => panic!("{} is not pre-training", run.label()),
    }
}

fn pg(run: &PlannedRun) -> &PgConfig {
    match &run.spec {
        RunSpec::Pg(c) => c,
        RunSpec::Pretrain(_) => panic!("{} is not RL", run.label()),
    }
}

/// The steps a run saves at.
fn save_steps(output: &kiln::train::config::OutputSection, total: u64) -> Vec<u64> {
    let policy = output.save_policy();
    (1..=total).filter(|&s| policy.saves(s, total)).collect()
}

fn clean(path: &Path) -> PathBuf {
    kiln::release::plan::clean(path).unwrap()
}

#[test]
fn pretraining_configs_carry_the_release_numbers() {
    let plan = full_plan();
    let root = clean(&repo("interplay-release"));
    assert_eq!(plan.root, root, "the full release is written to interplay-release/");
    let cases = [
        ("020305", "id2-10_0.2easy_0.3medium_0.5hard", 18809, [3762, 7524, 11286, 15048, 18809], [0.06, 0.86, 0.08, 0.10, 0.10, 0.10, 0.16, 0.16, 0.18]),
        ("050302", "id2-10_0.5easy_0.3medium_0.2hard", 18586, [3718, 7436, 11154, 14872, 18586], [0.18, 0.16, 0.16, 0.10, 0.10, 0.10, 0.08, 0.06, 0.06]),
    ];
    for (batch, setting, steps, saves, probs) in cases {
        let run = run(&plan, batch, "pretrain");
        let c = pretrain(run);
        assert_eq!(run.steps, steps);
        assert_eq!(c.train.steps, Some(steps));
        assert_eq!(save_steps(&c.output, steps), saves, "{batch}: the release's checkpoints");
        assert_eq!(run.published, root.join(format!("{batch}/pretrain/checkpoint-{steps}")));
        let DataSection::Mixture(m) = &c.data else { panic!("{batch}: a mixture") };
        assert_eq!(m.setting.as_deref(), Some(setting));
        assert_eq!(m.task, "composition-10B/op_level");
        assert_eq!(m.tokens, Some(TokenCount::Text("10B".into())));
        assert_eq!(readable_to_number("10B"), Some(1e10));
        assert_eq!(m.typo, Typo::Reproduce);
        assert_eq!(m.cutoff_len, 2048);
        assert_eq!(m.root, root.join("data"));
        let preset = Preset::load(m.preset.as_ref().unwrap(), &m.task, setting, TypoPolicy::Reproduce).unwrap();
        assert_eq!(preset.ops, (2..=10).collect::<Vec<u32>>());
        assert_eq!(preset.probs, probs, "{batch}: the PRESET shares (docs/interplay.md §2.6)");
        let tokens_per_step = c.train.micro_batch * c.train.grad_accum * m.cutoff_len;
        assert_eq!(tokens_per_step, 524_288, "256 blocks of 2048 tokens per step");
        assert_eq!(c.optimizer.lr, 1e-4);
        assert_eq!(c.optimizer.weight_decay, 0.1);
        assert_eq!(c.optimizer.max_grad_norm, Some(1.0));
        assert_eq!(c.schedule.kind, ScheduleKind::CosineWithMinLr);
        assert_eq!(c.schedule.min_lr, Some(3e-5));
        assert_eq!(c.schedule.warmup_ratio, 0.05);
        assert_eq!(c.train.seed, 42);
        let init = c.model.init.as_ref().unwrap();
        assert_eq!(std::fs::read(init).unwrap(), std::fs::read(repo("tests/fixtures/interplay/qwen2_100M/config.json")).unwrap());
        assert_eq!(run.model, "qwen2_100M");
    }
    // The library's copies of the paper's files are the golden ones.
    for file in ["PRESET.json", "qwen2_100M/config.json"] {
        assert_eq!(std::fs::read(repo(&format!("core/data/interplay/{file}"))).unwrap(), std::fs::read(repo(&format!("tests/fixtures/interplay/{file}"))).unwrap(), "{file}");
    }
}

#[test]
fn rl_and_opd_configs_carry_the_release_numbers() {
    let plan = full_plan();
    let root = clean(&repo("interplay-release"));
    let every_20: Vec<u64> = (1..=10).map(|i| i * 20).collect();
    for batch in ["020305", "050302"] {
        let base = run(&plan, batch, "pretrain").published.clone();
        let rls = [("op11_14", 11..=14), ("op13_20", 13..=20), ("op15_20", 15..=20)];
        for (name, ops) in rls {
            let run = run(&plan, batch, name);
            let c = pg(run);
            assert_eq!(run.kind, RunKind::Grpo);
            assert_eq!(run.steps, 200);
            assert_eq!(save_steps(&c.output, 200), every_20, "{batch} {name}: step20 ... step200");
            assert_eq!(run.published, root.join(format!("{batch}/rl/{name}_step200")));
            assert_eq!(c.model.from.as_ref(), Some(&base));
            let DataSection::Prompts(p) = &c.data else { panic!() };
            assert_eq!(p.ops, ops.collect::<Vec<u32>>(), "{batch} {name}");
            assert_eq!(p.dir.as_ref(), Some(&root.join("data/heldout")));
            assert_eq!((p.max_prompt_length, p.seed), (1024, 1));
            assert_eq!((c.rollout.n, c.rollout.temperature, c.rollout.top_p, c.rollout.top_k, c.rollout.max_response_length), (6, 1.0, 1.0, 0, 1024));
            assert_eq!((c.train.prompts_per_step, c.train.mini_batch, c.train.micro_batch), (1024, 256, 16));
            assert_eq!(c.optimizer.lr, 1e-6);
            assert_eq!(c.optimizer.weight_decay, 0.01);
            assert_eq!(c.schedule.kind, ScheduleKind::Constant);
            assert_eq!((c.loss.kl_coef, c.loss.kl_estimator, c.loss.clip_ratio, c.loss.clip_ratio_c), (0.001, KlEstimator::K3, 0.2, 3.0));
            assert_eq!(c.reward, Some(RewardConfig::Outcome));
            assert!(c.teacher.is_none());
            let eval = c.eval.as_ref().unwrap();
            assert_eq!((&eval.rows, eval.every, eval.id_max_op), (&root.join("data/val"), 20, Some(10)));
        }
        let teacher = if batch == "020305" { "op11_14" } else { "op13_20" };
        let opd = run(&plan, batch, "opd_refkl");
        let c = pg(opd);
        assert_eq!(opd.kind, RunKind::Opd);
        let t = c.teacher.as_ref().unwrap();
        assert_eq!(t.path, root.join(format!("{batch}/rl/{teacher}_step200")), "{batch}: the {teacher} teacher");
        assert_eq!((t.coef, t.full_vocab), (1.0, false));
        assert!(c.reward.is_none());
        assert_eq!((c.loss.kl_coef, c.loss.kl_estimator), (0.001, KlEstimator::K3), "ref-KL");
        assert_eq!((c.rollout.n, c.optimizer.lr, c.train.prompts_per_step), (6, 1e-6, 1024));
        assert_eq!(c.model.from.as_ref(), Some(&base));
        assert_eq!(save_steps(&c.output, 200), every_20);
        assert_eq!(c.output.dir, root.join(format!("{batch}/opd_refkl/sweep")));
        assert_eq!(c.output.name.as_deref(), Some(""), "sweep/step20 ... sweep/step180");
        assert_eq!(opd.last, root.join(format!("{batch}/opd_refkl/sweep/step200")));
        assert_eq!(opd.published, root.join(format!("{batch}/opd_refkl/{teacher}_step200")));
        let DataSection::Prompts(p) = &c.data else { panic!() };
        let teacher_ops: Vec<u32> = if batch == "020305" { (11..=14).collect() } else { (13..=20).collect() };
        assert_eq!(p.ops, teacher_ops, "{batch}: the teacher's prompts");
        let names: Vec<String> = plan.eval_models(batch).unwrap().into_iter().map(|m| m.name).collect();
        let last = if batch == "020305" { "18809" } else { "18586" };
        assert_eq!(
            names,
            [
                format!("pretrain_checkpoint-{last}"),
                "rl_op11_14_step200".into(),
                "rl_op13_20_step200".into(),
                "rl_op15_20_step200".into(),
                format!("opd_refkl_{teacher}_step200"),
            ],
            "{batch}: one summary row per final model"
        );
    }
    assert_eq!(plan.runs.len(), 10);
}

/// The configs run alone (`kiln rl --config …`) point where the release runner points them.
#[test]
fn standalone_paths_match_the_release_layout() {
    let plan = full_plan();
    for run in &plan.runs {
        let text = std::fs::read_to_string(&run.source).unwrap();
        match &run.spec {
            RunSpec::Pretrain(planned) => {
                let own = RunConfig::from_toml(&run.source, &text).unwrap();
                let DataSection::Mixture(m) = &own.data else { panic!() };
                let DataSection::Mixture(pm) = &planned.data else { panic!() };
                assert_eq!(clean(&m.root), pm.root, "{}", run.label());
                assert_eq!(clean(&own.output.dir), planned.output.dir, "{}", run.label());
            }
            RunSpec::Pg(planned) => {
                let own = PgConfig::from_toml(&run.source, &text).unwrap();
                assert_eq!(clean(own.model.from.as_ref().unwrap()), *planned.model.from.as_ref().unwrap(), "{}", run.label());
                assert_eq!(clean(&own.output.dir), planned.output.dir, "{}", run.label());
                let (DataSection::Prompts(a), DataSection::Prompts(b)) = (&own.data, &planned.data) else { panic!() };
                assert_eq!(a.dir.as_deref().map(clean), b.dir.clone(), "{}", run.label());
                let rows = |c: &PgConfig| c.eval.as_ref().map(|e| e.rows.clone());
                assert_eq!(rows(&own).as_deref().map(clean), rows(planned), "{}", run.label());
                let teacher = |c: &PgConfig| c.teacher.as_ref().map(|t| t.path.clone());
                assert_eq!(teacher(&own).as_deref().map(clean), teacher(planned), "{}", run.label());
            }
        }
    }
}

#[test]
fn evaluation_counts_and_data_commands_are_the_releases() {
    let plan = full_plan();
    let eval = &plan.eval;
    assert_eq!((eval.samples, eval.temperature, eval.top_p, eval.top_k, eval.max_new_tokens, eval.id_op_threshold), (128, 0.7, 1.0, 0, 1024, 10));
    assert_eq!(eval.models, EvalModels::Final);
    let test = plan.splits.iter().find(|s| s.split == "test").unwrap();
    let ops = test.op_list().unwrap();
    let id = ops.iter().filter(|&&op| op <= 10).count() * test.per_op * eval.samples;
    let ood = ops.iter().filter(|&&op| op > 10).count() * test.per_op * eval.samples;
    assert_eq!((id, ood, id + ood), (1_152_000, 1_280_000, 2_432_000));
    let command = test.command(Path::new("ROOT/data"), plan.seed);
    assert_eq!(command, "kiln data interplay --split test --ops 2-20 --per-op 1000 --seed 1 --out ROOT/data");
    let text = std::fs::read_to_string(release_file()).unwrap();
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for spec in &plan.splits {
        let command = spec.command(Path::new("ROOT/data"), plan.seed);
        assert!(words.contains(&command), "release.toml documents `{command}`");
    }
    let heldout = plan.splits.iter().find(|s| s.split == "heldout").unwrap();
    assert_eq!((heldout.op_list().unwrap(), heldout.per_op), ((11..=20).collect(), 50_000));
}

/// Every scale plans, and every effective config it writes reads back as the same config.
#[test]
fn every_scale_plans_and_its_effective_configs_read_back() {
    let config = release();
    let tmp = tempfile::tempdir().unwrap();
    for scale in [FULL, "cpu", "mini", "tiny"] {
        let plan = kiln::release::plan(&config, &release_file(), scale, None).unwrap();
        assert_eq!(plan.runs.len(), if scale == "cpu" { 4 } else { 10 }, "{scale}: cpu runs two of each batch's five");
        if scale != FULL {
            assert!(plan.root.ends_with(format!("interplay-release-{scale}")), "{}", plan.root.display());
            let (model, dir) = plan.model.as_ref().unwrap();
            assert_eq!(dir, &plan.root.join("model").join(&model.name));
            assert_eq!(model.config_json()["max_position_embeddings"], 2048);
            assert!(plan.splits.iter().any(|s| s.split == "train"), "{scale} generates its pre-training rows");
        }
        for run in &plan.runs {
            let path = tmp.path().join(format!("{scale}_{}_{}.toml", run.batch, run.name));
            let text = run.config_toml().unwrap();
            std::fs::write(&path, &text).unwrap();
            match &run.spec {
                RunSpec::Pretrain(c) => assert_eq!(&RunConfig::from_toml(&path, &text).unwrap(), c, "{scale} {}", run.label()),
                RunSpec::Pg(c) => assert_eq!(&PgConfig::from_toml(&path, &text).unwrap(), c, "{scale} {}", run.label()),
            }
        }
    }
    let e = kiln::release::plan(&config, &release_file(), "huge", None).unwrap_err().to_string();
    assert!(e.contains("no scale \"huge\"") && e.contains("full, cpu, mini, tiny"), "{e}");
}

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

fn ok(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kiln failed:\n{stderr}");
    stderr + &String::from_utf8_lossy(&out.stdout)
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

fn index(root: &Path, batch: &str) -> Vec<Value> {
    serde_json::from_str::<Value>(&std::fs::read_to_string(root.join(batch).join("runs.json")).unwrap()).unwrap().as_array().unwrap().clone()
}

/// `kiln release run --scale tiny` writes the whole layout, a run index per batch and a summary
/// row per final model; run again it skips every finished stage; a run whose last checkpoint
/// is gone resumes from its latest one; the evaluation on `--devices cpu,cpu` writes the files
/// of one device. (About a minute in a debug build on 2 quiet cores.)
#[test]
fn tiny_release_runs_end_to_end_resumes_and_skips() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    let (config, root_arg) = (release_file(), root.to_str().unwrap().to_owned());
    let args = |stages: &'static str| vec!["release", "run", "--config", config.to_str().unwrap(), "--scale", "tiny", "--out", &root_arg, "--stages", stages].into_iter().map(String::from).collect::<Vec<_>>();
    let call = |stages: &'static str| kiln(&args(stages).iter().map(String::as_str).collect::<Vec<_>>());

    // An RL step that does not split over the devices: one error line before anything is
    // written (the data and pre-training stages would otherwise run first).
    let mut three = args("data,pretrain,rl");
    three.extend(["--devices".to_string(), "cpu,cpu,cpu".into()]);
    let out = kiln(&three.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(!out.status.success() && last.starts_with("error: release ") && last.contains(": 020305 rl op11_14 (") && last.contains("multiples of the 3 replicas"), "{stderr}");
    assert!(!root.exists(), "nothing written");

    // A later stage before its inputs exist: one error line naming the stage to run.
    let out = call("rl");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap();
    assert!(last.starts_with("error: ") && last.contains("run the pretrain stage first"), "{stderr}");

    let log = ok(call("data,pretrain,rl,opd,eval"));
    for (batch, teacher) in [("020305", "op11_14"), ("050302", "op13_20")] {
        let dir = root.join(batch);
        for rel in ["pretrain/checkpoint-1", "pretrain/checkpoint-2", "opd_refkl/sweep/step1"] {
            assert!(dir.join(rel).join("config.json").is_file(), "{batch}/{rel}\n{log}");
        }
        for name in ["op11_14", "op13_20", "op15_20"] {
            for step in [1, 2] {
                assert!(dir.join(format!("rl/{name}_step{step}/model.safetensors")).is_file(), "{batch} {name} {step}");
            }
        }
        assert!(dir.join(format!("opd_refkl/{teacher}_step2/model.safetensors")).is_file(), "{batch}: the final OPD model");
        assert!(!dir.join("opd_refkl/sweep/step2").exists(), "{batch}: the last sweep step is moved, not copied");
        for config in ["pretrain.toml", "rl_op11_14.toml", "rl_op13_20.toml", "rl_op15_20.toml", "opd_refkl.toml"] {
            assert!(dir.join("configs").join(config).is_file(), "{batch}/configs/{config}");
        }

        let records = index(&root, batch);
        let runs: Vec<&str> = records.iter().map(|r| r["run"].as_str().unwrap()).collect();
        assert_eq!(runs, ["pretrain", "rl op11_14", "rl op13_20", "rl op15_20", "opd", "eval"], "{batch}");
        for r in &records {
            assert!(r["start"].as_str().is_some_and(|s| s.ends_with('Z')) && r["end"].is_string(), "{r}");
        }
        let opd = records.iter().find(|r| r["run"] == "opd").unwrap();
        assert_eq!(opd["path"], format!("opd_refkl/{teacher}_step2"));
        assert_eq!(opd["from"], "pretrain/checkpoint-2");
        assert_eq!(opd["config"], "configs/opd_refkl.toml");
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains(&format!("| `rl/op15_20_step2` | rl op15_20 | `configs/rl_op15_20.toml` (from `{}`)", repo(&format!("examples/configs/release/{batch}/rl_op15_20.toml")).display())), "{readme}");

        let csv = std::fs::read_to_string(dir.join("evals/summary.csv")).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert!(lines[0].starts_with("checkpoint,id_acc,ood_acc,total_acc"), "{csv}");
        let names: Vec<&str> = lines[1..].iter().map(|l| l.split(',').next().unwrap()).collect();
        assert_eq!(names, ["pretrain_checkpoint-2", "rl_op11_14_step2", "rl_op13_20_step2", "rl_op15_20_step2", &format!("opd_refkl_{teacher}_step2")], "one row per final model");
        let summary: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("evals/summary.json")).unwrap()).unwrap();
        for record in summary.as_array().unwrap() {
            assert_eq!((record["count_id"].as_u64(), record["count_ood"].as_u64()), (Some(9), Some(10)), "ops 2-10 and 11-20, one prompt and sample each");
        }
    }
    let csv = std::fs::read_to_string(root.join("summary.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows[0], ["batch", "role", "model", "id_acc", "ood_acc", "total_acc", "release_id_acc", "release_ood_acc", "release_total_acc"]);
    assert_eq!(rows.len(), 11, "one row per release model: {csv}");
    for row in &rows[1..] {
        assert!(row[3..6].iter().all(|v| v.parse::<f64>().is_ok_and(|v| (0.0..=1.0).contains(&v))), "evaluated: {row:?}");
    }
    assert_eq!(rows[10][..3], ["050302", "opd", "opd_refkl_op13_20_step2"]);
    assert_eq!(rows[10][6..], ["0.709348", "0.342995", "0.51653"], "the release's figures beside");
    let md = std::fs::read_to_string(root.join("summary.md")).unwrap();
    assert_eq!(md.lines().filter(|l| l.starts_with("| 020305 |") || l.starts_with("| 050302 |")).count(), 10, "{md}");
    assert!(md.contains("| 050302 | `opd_refkl_op13_20_step2` |") && md.contains("0.5165"), "{md}");
    // The paper's charts per batch: every model's accuracy by op, and RL/OPD against the base.
    for batch in ["020305", "050302"] {
        for (chart, label) in [("accuracy_by_op", "rl op15_20"), ("rl_vs_base", "opd − base")] {
            let name = format!("{batch}_{chart}.svg");
            let svg = std::fs::read_to_string(root.join(&name)).unwrap();
            assert!(svg.starts_with("<svg") && svg.contains(label) && svg.matches("<circle").count() >= 19, "{name}: {svg}");
            assert!(md.contains(&format!("]({name})")), "{md}");
        }
    }

    // Again: every stage is finished and nothing is rewritten.
    let final_rl = root.join("020305/rl/op11_14_step2/model.safetensors");
    let (before, metrics) = (modified(&final_rl), modified(&root.join("020305/evals/rl_op11_14_step2_metrics.json")));
    let log = ok(call("data,pretrain,rl,opd,eval"));
    assert_eq!(log.matches(": finished (").count(), 10, "{log}");
    assert_eq!(log.matches("every model is evaluated, skipped").count(), 2, "{log}");
    assert_eq!(log.matches("kept (files exist)").count(), 3, "{log}");
    assert_eq!((modified(&final_rl), modified(&root.join("020305/evals/rl_op11_14_step2_metrics.json"))), (before, metrics));

    // The scale's model directory holding another architecture than the config's: refused,
    // naming the file and the keys; nothing rewritten.
    let model_config = std::fs::read_dir(root.join("model")).unwrap().next().unwrap().unwrap().path().join("config.json");
    let kept = std::fs::read_to_string(&model_config).unwrap();
    let mut other: Value = serde_json::from_str(&kept).unwrap();
    other["hidden_size"] = Value::from(other["hidden_size"].as_u64().unwrap() * 2);
    std::fs::write(&model_config, other.to_string()).unwrap();
    let out = call("data");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(!out.status.success() && last.contains(model_config.to_str().unwrap()) && last.contains("(hidden_size differ)"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&model_config).unwrap(), other.to_string());
    std::fs::write(&model_config, kept).unwrap();

    // An interrupted run (its last checkpoint missing) resumes from its latest one; its index
    // record keeps its start.
    let start = index(&root, "020305").iter().find(|r| r["run"] == "rl op13_20").unwrap()["start"].clone();
    std::fs::remove_dir_all(root.join("020305/rl/op13_20_step2")).unwrap();
    std::fs::remove_dir_all(root.join("020305/opd_refkl/op11_14_step2")).unwrap();
    // (its effective config, edited since, is rewritten and the edited one kept beside it)
    let effective = root.join("020305/configs/rl_op13_20.toml");
    let edited = std::fs::read_to_string(&effective).unwrap() + "# edited\n";
    std::fs::write(&effective, &edited).unwrap();
    let log = ok(call("rl,opd"));
    assert_eq!(std::fs::read_to_string(root.join("020305/configs/rl_op13_20.toml.prev")).unwrap(), edited);
    assert!(!std::fs::read_to_string(&effective).unwrap().contains("# edited"));
    assert!(log.contains("020305 rl op13_20: 2 steps into") && log.contains("resuming from step 1"), "{log}");
    assert!(log.contains("020305 opd: 2 steps into"), "{log}");
    assert!(root.join("020305/rl/op13_20_step2/model.safetensors").is_file());
    assert!(root.join("020305/opd_refkl/op11_14_step2/model.safetensors").is_file() && !root.join("020305/opd_refkl/sweep/step2").exists());
    assert_eq!(log.matches(": finished (").count(), 6, "{log}");
    let record = index(&root, "020305").into_iter().find(|r| r["run"] == "rl op13_20").unwrap();
    assert_eq!(record["start"], start);
    assert!(record["end"].is_string());

    // The evaluation on two devices writes the files of one.
    let evals = root.join("050302/evals");
    let files = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => stack.push(path),
                    false => out.push((path.strip_prefix(dir).unwrap().display().to_string(), std::fs::read(&path).unwrap())),
                }
            }
        }
        out.sort();
        out
    };
    let one_device = files(&evals);
    assert!(one_device.len() > 10, "{:?}", one_device.iter().map(|f| &f.0).collect::<Vec<_>>());
    std::fs::remove_dir_all(&evals).unwrap();
    let mut two = args("eval");
    two.extend(["--devices".to_owned(), "cpu,cpu".to_owned()]);
    let log = ok(kiln(&two.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(log.contains("on 2 devices: cpu,cpu") && log.contains("050302: 5 models"), "{log}");
    assert!(files(&evals) == one_device, "050302/evals on two devices differs from one device");
}

/// The cpu scale maps the release's ops onto its own: each batch's mixture (020305's typo
/// included), the RL ranges, the ID threshold of the evaluation; it makes each batch's pre-training
/// and its RL on op 5-6 only.
#[test]
fn the_cpu_scale_maps_the_release_ops() {
    let plan = kiln::release::plan(&release(), &release_file(), "cpu", None).unwrap();
    assert_eq!(plan.batches, ["020305", "050302"]);
    assert_eq!(plan.eval.id_op_threshold, 4);
    let test: Vec<(Vec<u32>, usize)> = plan.splits.iter().filter(|s| s.split == "test").map(|s| (s.op_list().unwrap(), s.per_op)).collect();
    assert_eq!(test, [(vec![2, 3, 4], 50), (vec![5, 6, 7, 8], 150)], "three times the prompts on the OOD ops the claims compare");
    let labels: Vec<String> = plan.runs.iter().map(PlannedRun::label).collect();
    assert_eq!(labels, ["020305 pretrain", "050302 pretrain", "020305 rl op11_14", "050302 rl op11_14"]);
    for (batch, mixture) in [("020305", [1.0, 0.3, 0.5]), ("050302", [0.5, 0.3, 0.2])] {
        let DataSection::Mixture(m) = &pretrain(run(&plan, batch, "pretrain")).data else { panic!("a mixture") };
        assert_eq!((m.ops.as_deref(), m.preset.as_ref()), (Some(&[2, 3, 4][..]), None));
        let probs = m.probs.as_ref().unwrap();
        assert!(probs.iter().zip(mixture).all(|(a, b)| (a - b).abs() < 1e-9), "{batch} as written (020305: op 3 = .86): {probs:?}");
    }
    // Every run of the release, at this scale's ops.
    let mut every = release();
    every.scale.get_mut("cpu").unwrap().runs = None;
    let plan = kiln::release::plan(&every, &release_file(), "cpu", None).unwrap();
    for (name, ops) in [("op11_14", vec![5, 6]), ("op13_20", vec![6, 7, 8]), ("op15_20", vec![7, 8]), ("opd_refkl", vec![5, 6])] {
        let DataSection::Prompts(p) = &pg(run(&plan, "020305", name)).data else { panic!("prompts") };
        assert_eq!(p.ops, ops, "{name}");
    }
    let effects = kiln::release::report::effects(&[], plan.ops.as_ref());
    assert!(effects.iter().any(|e| e.claim == "RL on op 5-6 (release 11-14) raises OOD accuracy over the base (020305)"), "{effects:?}");
}

/// `[scale.*] runs` names runs the batches have, and keeps an OPD run's teacher.
#[test]
fn a_scale_names_runs_that_exist() {
    let plan_with = |runs: &[&str]| {
        let mut config = release();
        config.scale.get_mut("cpu").unwrap().runs = Some(runs.iter().map(|r| r.to_string()).collect());
        kiln::release::plan(&config, &release_file(), "cpu", None).map(|p| p.runs.iter().map(PlannedRun::label).collect::<Vec<_>>())
    };
    let e = plan_with(&["op11_15"]).unwrap_err().to_string();
    assert!(e.contains("release.toml") && e.contains("[scale.cpu] runs") && e.contains("no run \"op11_15\"") && e.contains("op13_20"), "{e}");
    let text = std::fs::read_to_string(release_file()).unwrap().replace("runs = [\"op11_14\"]", "runs = []");
    let e = ReleaseConfig::from_toml(&release_file(), &text).unwrap_err().to_string();
    assert!(e.contains("[scale.cpu] runs: name at least one"), "{e}");
    let e = plan_with(&["opd_refkl"]).unwrap_err().to_string();
    assert!(e.contains("020305's opd_refkl distils its RL run \"op11_14\": name it too"), "{e}");
    let e = plan_with(&["opd_refkl", "op11_14"]).unwrap_err().to_string();
    assert!(e.contains("050302's opd_refkl distils its RL run \"op13_20\""), "{e}");
    let labels = plan_with(&["op13_20", "opd_refkl", "op11_14"]).unwrap();
    assert_eq!(labels.len(), 2 + 2 * 2 + 2, "{labels:?}");
    assert!(labels.contains(&"050302 opd".to_owned()) && !labels.iter().any(|l| l.ends_with("op15_20")), "{labels:?}");

    // Two RL runs of a batch under one [output] name would share checkpoints (the second was
    // skipped as finished, or resumed from the first's).
    let mut config = release();
    let first = config.batches[0].rl[0].clone();
    config.batches[0].rl.push(first.clone());
    let e = kiln::release::plan(&config, &release_file(), "cpu", None).unwrap_err().to_string();
    assert!(e.contains(first.to_str().unwrap()) && e.contains("is also") && e.contains("the two runs would share checkpoints"), "{e}");
    // ... and two under one file name would share `<batch>/configs/<file name>`.
    let dir = tempfile::tempdir().unwrap();
    let twin = dir.path().join(first.file_name().unwrap());
    std::fs::write(&twin, std::fs::read_to_string(&first).unwrap().replace("name = \"op11_14\"", "name = \"twin\"")).unwrap();
    let mut config = release();
    config.batches[0].rl.push(twin.clone());
    let e = kiln::release::plan(&config, &release_file(), "cpu", None).unwrap_err().to_string();
    assert!(e.contains(twin.to_str().unwrap()) && e.contains("has the same file name") && e.contains("share one file"), "{e}");
}

/// The evaluation refuses a test file the scale's splits do not name (another per-op count left
/// in the root), since it would read it with the others.
#[test]
fn evaluation_refuses_test_files_the_scale_does_not_name() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = kiln::release::plan(&release(), &release_file(), "cpu", Some(tmp.path())).unwrap();
    let test = plan.data_dir().join("test");
    std::fs::create_dir_all(&test).unwrap();
    for (ops, per_op) in [(2..=4, 50), (5..=8, 150)] {
        for op in ops {
            std::fs::write(test.join(format!("op{op}-{per_op}.jsonl")), "").unwrap();
        }
    }
    std::fs::write(test.join("notes.txt"), "").unwrap();
    kiln::release::runner::check_test_split(&plan).unwrap();
    std::fs::write(test.join("op5-50.jsonl"), "").unwrap();
    let e = kiln::release::runner::check_test_split(&plan).unwrap_err().to_string();
    assert!(e.contains("op5-50.jsonl") && e.contains("op5-150.jsonl") && e.contains("fresh --out"), "{e}");
}
