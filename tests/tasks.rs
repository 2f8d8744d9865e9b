//! The Task interface from outside the library: a toy task (not Interplay) drives RL prompts and
//! validation, and a toy evaluation runs through the generic, resumable evaluation runner.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::fixture;
use kiln::backends::Cpu;
use kiln::eval::{EvalSettings, ModelEntry, evaluate};
use kiln::io::pyjson::Json;
use kiln::io::{jsonl_records, read_jsonl, write_atomic};
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::rl::prompts::PromptSet;
use kiln::rl::validate::{ValidationSettings, Validator};
use kiln::tasks::{Completion, Evaluation, FinishedRun, Item, Items, Part, Reward, RewardConfig, Source, Task};
use kiln::tokenizer::Tokenizer;
use serde_json::{Value, json};

fn tokenizer_dir() -> PathBuf {
    fixture("interplay/qwen2_100M")
}

/// A tiny random Qwen2 with the paper's tokenizer.
fn tiny_model(dir: &Path) {
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 2200, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true,
            "max_position_embeddings": 256, "rope_theta": 10000.0, "eos_token_id": 3}"#,
    )
    .unwrap();
    let model = Qwen2::<Cpu>::random(&config, 5, &Default::default()).unwrap();
    hf::save(&model, dir, SaveDtype::F32, Some(&tokenizer_dir())).unwrap();
}

/// Rows `{"level", "score"}`: the prompt is fixed text, and the reward of any response is the
/// row's `score`, so every aggregate is known in advance.
struct Scored;

impl Task for Scored {
    fn name(&self) -> &str {
        "scored"
    }

    fn items(&self, path: &Path) -> kiln::Result<Items> {
        let file = path.to_path_buf();
        Ok(Box::new(jsonl_records(path)?.map(move |record| {
            let record = record?;
            let level = record.int_field(&file, "level")?;
            let score = record.fields.get("score").and_then(Value::as_f64);
            let source = Source { file: file.clone(), line: record.line };
            let score = score.ok_or_else(|| source.error("missing \"score\""))?;
            Ok(Item {
                id: format!("{level}-{}", record.line),
                group: format!("lvl{level}"),
                level: Some(level),
                prompt: "<question> The number of adult owl equals 2. </question> <solution>".into(),
                reference: None,
                gold: json!(score),
                source,
            })
        })))
    }

    fn evaluate(&self, _response: &str, item: &Item) -> f64 {
        item.gold.as_f64().unwrap()
    }

    fn reward(&self, config: &RewardConfig) -> kiln::Result<Box<dyn Reward>> {
        match config {
            RewardConfig::Outcome => Ok(Box::new(GoldScore)),
            other => Err(kiln::Error::InvalidInput(format!("no {} reward", other.kind()))),
        }
    }
}

/// Responses [`GoldScore`] was asked to score in batches.
static BATCH_SCORED: AtomicUsize = AtomicUsize::new(0);

/// The row's score.
struct GoldScore;

impl Reward for GoldScore {
    fn score(&self, _response: &str, item: &Item) -> f64 {
        item.gold.as_f64().unwrap()
    }

    fn score_batch(&self, batch: &[(&str, &Item)]) -> kiln::Result<Vec<f64>> {
        BATCH_SCORED.fetch_add(batch.len(), Ordering::SeqCst);
        Ok(batch.iter().map(|(r, i)| self.score(r, i)).collect())
    }
}

fn write_rows(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    // Level 1 (ID at id_max_op = 1): 0.0, 1.0, [0.5 beyond rows_per_op]; level 2: 0.25, 0.25; level 3: 1.0.
    for (level, scores) in [(1, vec![0.0, 1.0, 0.5]), (2, vec![0.25, 0.25]), (3, vec![1.0])] {
        let lines: Vec<String> = scores.iter().map(|s| json!({"level": level, "score": s}).to_string()).collect();
        std::fs::write(dir.join(format!("l{level}.jsonl")), lines.join("\n") + "\n").unwrap();
    }
}

#[test]
fn a_custom_task_drives_rl_prompts_and_validation() {
    let tmp = tempfile::tempdir().unwrap();
    let val = tmp.path().join("val");
    write_rows(&val);
    let model_dir = tmp.path().join("model");
    tiny_model(&model_dir);
    let tokenizer = Tokenizer::from_file(&model_dir).unwrap();
    let model = hf::load::<Cpu>(&model_dir, &Default::default()).unwrap();

    let files: Vec<PathBuf> = ["l1", "l2", "l3"].iter().map(|f| val.join(format!("{f}.jsonl"))).collect();
    let prompts = PromptSet::from_task(&Scored, &files, &tokenizer, 512, Some(2)).unwrap();
    assert_eq!(prompts.len(), 5, "two rows per file at most");
    assert_eq!(prompts.report.files.iter().map(|f| f.kept).collect::<Vec<_>>(), [2, 2, 1]);
    assert!(prompts.iter().all(|p| p.ids == tokenizer.encode(&p.item.prompt).unwrap()));

    let settings = ValidationSettings { id_max_level: Some(1), rows_per_op: Some(2), max_prompt_length: 512, max_new_tokens: 3, batch_size: 8, kv_memory: None, max_prefill_tokens: kiln::generate::MAX_PREFILL_TOKENS };
    let validator = Validator::from_task(Arc::new(Scored), &val, &tokenizer, vec![3], &settings).unwrap();
    let record = validator.evaluate(&model).unwrap();
    let number = |key: &str| record.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("{key} missing: {record:?}"));
    assert_eq!(number("val_accuracy_lvl1"), 0.5);
    assert_eq!(number("val_accuracy_lvl2"), 0.25);
    assert_eq!(number("val_accuracy_lvl3"), 1.0);
    assert_eq!(number("val_accuracy_id"), 0.5);
    assert_eq!(number("val_accuracy_ood"), (0.25 + 0.25 + 1.0) / 3.0);
    assert!((1.0..=3.0).contains(&number("val_response_length")));
    assert_eq!(BATCH_SCORED.load(Ordering::SeqCst), 5, "validation scores through Reward::score_batch");

    // A row the task cannot read: the error names the file and line.
    std::fs::write(val.join("l2.jsonl"), "{\"level\": 2, \"score\": 0.5}\n{\"level\": 2}\n").unwrap();
    let e = Validator::from_task(Arc::new(Scored), &val, &tokenizer, vec![3], &settings).err().unwrap().to_string();
    assert!(e.contains("l2.jsonl line 2") && e.contains("score"), "{e}");
    // A reward the task does not have.
    let e = Scored.reward(&RewardConfig::Process { answer_weight: 1.0, step_weight: 0.0, zero_on_process_mismatch: false, value_tolerance: 0.0 });
    assert!(e.err().unwrap().to_string().contains("no process reward"));
}

/// One part, `all`: a record per sample, and a marker file with the number of records.
struct Counting {
    items: Vec<Item>,
    finished: AtomicUsize,
}

impl Evaluation for Counting {
    fn parts(&self) -> Vec<Part<'_>> {
        vec![Part { name: "all", items: &self.items }]
    }

    fn fingerprint(&self) -> String {
        self.items.len().to_string()
    }

    fn records(&self, part: usize, start: usize, samples: &[Vec<Completion>]) -> kiln::Result<Vec<String>> {
        assert_eq!(part, 0);
        Ok(samples
            .iter()
            .enumerate()
            .flat_map(|(i, completions)| completions.iter().map(move |c| json!({"idx": start + i, "tokens": c.tokens}).to_string()))
            .collect())
    }

    fn loss_text(&self, _part: usize, _index: usize) -> Option<&str> {
        None
    }

    fn finished_marker(&self, out: &Path, model: &str) -> PathBuf {
        out.join(format!("{model}_count.json"))
    }

    fn finish(&self, model: &str, out: &Path, run: &FinishedRun<'_>, stage: &mut dyn FnMut(&'static str)) -> kiln::Result<()> {
        stage("counting");
        self.finished.fetch_add(1, Ordering::SeqCst);
        let records = read_jsonl(&run.generations[0])?;
        let idx: Vec<u64> = records.iter().map(|r| r.fields["idx"].as_u64().unwrap()).collect();
        let expected: Vec<u64> = (0..self.items.len() as u64).flat_map(|i| std::iter::repeat_n(i, run.samples)).collect();
        assert_eq!(idx, expected, "records in item order, `samples` each");
        if !run.keep_generations {
            std::fs::remove_file(&run.generations[0]).unwrap();
        }
        write_atomic(&self.finished_marker(out, model), &records.len().to_string())
    }

    fn summary(&self, out: &Path, model: &str) -> kiln::Result<Json> {
        let count = std::fs::read_to_string(self.finished_marker(out, model)).unwrap();
        Ok(Json::object([("model", Json::from(model)), ("count", Json::Int(count.parse().unwrap()))]))
    }

    fn write_summaries(&self, out: &Path, models: &[String]) -> kiln::Result<()> {
        write_atomic(&out.join("toy_summary.txt"), &models.join(","))
    }
}

#[test]
fn a_custom_evaluation_runs_through_the_generic_runner() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = tmp.path().join("rows");
    write_rows(&rows);
    let items = kiln::tasks::load_items(&Scored, &[rows.join("l1.jsonl")], None).unwrap();
    let evaluation = Counting { items, finished: AtomicUsize::new(0) };
    let models: Vec<ModelEntry> = ["a", "b"]
        .iter()
        .map(|name| {
            let path = tmp.path().join(name);
            tiny_model(&path);
            ModelEntry { name: name.to_string(), path }
        })
        .collect();
    let out = tmp.path().join("out");
    let settings = EvalSettings { samples: 2, max_new_tokens: 3, shard_prompts: 2, stop: Vec::new(), ..EvalSettings::default() };
    let mut stages = Vec::new();
    let outcomes = evaluate::<Cpu>(&models, &evaluation, &out, &settings, &Default::default(), |event| {
        if let kiln::eval::EvalEvent::Stage { name, stage } = event {
            stages.push(format!("{name}:{stage}"));
        }
    })
    .unwrap();
    assert_eq!(stages, ["a:counting", "b:counting"]);
    assert_eq!(outcomes.iter().map(|o| (o.skipped, o.summary.get("count").cloned())).collect::<Vec<_>>(), vec![(false, Some(Json::Int(6))), (false, Some(Json::Int(6)))]);
    assert_eq!(std::fs::read_to_string(out.join("toy_summary.txt")).unwrap(), "a,b");
    assert!(!out.join("a_all_generations.jsonl").exists() && !out.join(".shards").exists());

    // Finished models are skipped; the summary still lists them.
    let outcomes = evaluate::<Cpu>(&models, &evaluation, &out, &settings, &Default::default(), |_| {}).unwrap();
    assert!(outcomes.iter().all(|o| o.skipped));
    assert_eq!(evaluation.finished.load(Ordering::SeqCst), 2);
}
