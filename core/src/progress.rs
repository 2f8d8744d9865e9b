//! Progress of long library work that has no bar of its own: validation and held-out generation
//! during training, data preparation before it. A front end installs a [`Reporter`] once
//! ([`set_reporter`]); without one a [`stage`] costs nothing. (kiln's CLI draws each stage as a
//! bar with an ETA, or a plain line every 30 s without a terminal.)
//!
//! ```
//! let stage = kiln_core::progress::stage("tokenizing shards", 3, "shards");
//! for i in 0..3 {
//!     stage.set_position(i + 1);
//! }
//! ```

use std::cell::Cell;
use std::sync::{Arc, RwLock};

/// Draws stages for a front end.
pub trait Reporter: Send + Sync {
    /// A stage of `total` `unit`s named `what` begins.
    fn start(&self, what: &str, total: u64, unit: &str) -> Box<dyn StageSink>;
}

/// One running stage, as the front end draws it.
pub trait StageSink: Send + Sync {
    /// `position` of the stage's total are done.
    fn set_position(&self, position: u64);
    /// The stage is over (done, or left by an error).
    fn finish(&self);
}

static REPORTER: RwLock<Option<Arc<dyn Reporter>>> = RwLock::new(None);

thread_local! {
    static SILENCED: Cell<bool> = const { Cell::new(false) };
}

/// Installs `reporter` for every later stage (`None`: report nothing).
pub fn set_reporter(reporter: Option<Arc<dyn Reporter>>) {
    *REPORTER.write().unwrap_or_else(|e| e.into_inner()) = reporter;
}

/// A stage of `total` `unit`s named `what`, reported to the installed [`Reporter`] (if any, and
/// unless [`silenced`]); finished when dropped.
pub fn stage(what: &str, total: u64, unit: &str) -> Stage {
    if SILENCED.with(Cell::get) {
        return Stage(None);
    }
    let reporter = REPORTER.read().unwrap_or_else(|e| e.into_inner()).clone();
    Stage(reporter.map(|r| r.start(what, total, unit)))
}

/// A [`stage`] named `verb` and the name of the file at `path` (`scoring generations.jsonl`).
pub fn file_stage(verb: &str, path: &std::path::Path, total: u64, unit: &str) -> Stage {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    stage(&format!("{verb} {name}"), total, unit)
}

/// Runs `f` with the stages it starts on this thread unreported (the replicas other than the
/// first, which do the same work).
pub fn silenced<R>(f: impl FnOnce() -> R) -> R {
    let before = SILENCED.with(|s| s.replace(true));
    let result = f();
    SILENCED.with(|s| s.set(before));
    result
}

/// A running stage (see [`stage`]).
pub struct Stage(Option<Box<dyn StageSink>>);

impl Stage {
    /// `position` of the stage's total are done.
    pub fn set_position(&self, position: u64) {
        if let Some(sink) = &self.0 {
            sink.set_position(position);
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some(sink) = &self.0 {
            sink.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records `<stage> <event>`; other tests' stages may land here too (the reporter is global).
    struct Log(Arc<Mutex<Vec<String>>>, String);

    /// Held by the tests that install a reporter, so that one does not replace another's.
    static INSTALLING: Mutex<()> = Mutex::new(());

    impl Reporter for Log {
        fn start(&self, what: &str, total: u64, unit: &str) -> Box<dyn StageSink> {
            self.0.lock().unwrap().push(format!("{what} start {total} {unit}"));
            Box::new(Log(self.0.clone(), what.to_owned()))
        }
    }

    impl StageSink for Log {
        fn set_position(&self, position: u64) {
            self.0.lock().unwrap().push(format!("{} at {position}", self.1));
        }
        fn finish(&self) {
            self.0.lock().unwrap().push(format!("{} finish", self.1));
        }
    }

    #[test]
    fn stages_reach_the_reporter_unless_silenced() {
        let _installing = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
        let log = Arc::new(Mutex::new(Vec::new()));
        set_reporter(Some(Arc::new(Log(log.clone(), String::new()))));
        {
            let stage = stage("test-validation", 2, "completions");
            stage.set_position(1);
            silenced(|| super::stage("test-quiet", 1, "rows").set_position(1));
        }
        set_reporter(None);
        stage("test-after", 1, "rows").set_position(1);
        let ours: Vec<String> = log.lock().unwrap().iter().filter(|l| l.starts_with("test-")).cloned().collect();
        assert_eq!(ours, ["test-validation start 2 completions", "test-validation at 1", "test-validation finish"]);
    }

    /// `kiln init` of a large model drew its weights for minutes without a word.
    #[test]
    fn initialising_a_model_reports_its_parameters() {
        let config: crate::model::Qwen2Config = serde_json::from_str(
            r#"{"vocab_size": 13, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        let _installing = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
        let log = Arc::new(Mutex::new(Vec::new()));
        set_reporter(Some(Arc::new(Log(log.clone(), String::new()))));
        let tmp = tempfile::tempdir().unwrap();
        crate::model::hf::save_random(&config, 1, tmp.path().join("m"), crate::model::Dtype::F32, None).unwrap();
        // A directory it could not write to is refused before any weight is drawn.
        let err = crate::model::hf::save_random(&config, 1, tmp.path().join("m"), crate::model::Dtype::F32, None).unwrap_err().to_string();
        set_reporter(None);
        assert!(err.contains("already exists and is not empty"), "{err}");
        let total = config.num_parameters();
        let log = log.lock().unwrap();
        let starts = log.iter().filter(|l| **l == format!("initialising weights start {total} parameters")).count();
        assert_eq!(starts, 1, "{log:?}");
        assert!(log.contains(&format!("initialising weights at {total}")), "{log:?}");
        assert!(log.contains(&"writing model.safetensors finish".to_string()), "{log:?}");
    }
}
