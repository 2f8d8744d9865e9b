//! Work on disk between runs: the items of each part of an evaluation are cut into shards of
//! consecutive items, and every finished shard is a file under `<out>/.shards/<model>/<part>/`
//! (Interplay: `id`, `ood`) that appears whole or not at all. A killed evaluation restarts at the first missing shard. `settings.json` records
//! what the shards were made with; shards made with other settings or other data are never
//! mixed in.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::pyjson::{Json, Style};
use crate::io::{AtomicFile, write_atomic};

pub use crate::io::remove_dir;

/// What a shard file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardKind {
    /// Generation records (lines of the generations file).
    Generations,
    /// Per-row teacher-forced losses.
    Loss,
}

/// The shard directory of one model.
#[derive(Debug, Clone)]
pub struct ShardStore {
    dir: PathBuf,
}

impl ShardStore {
    /// `<out>/.shards/<model>`.
    pub fn dir_for(out: &Path, model: &str) -> PathBuf {
        out.join(".shards").join(model)
    }

    /// Opens (creating if needed) the store in `dir` for work described by `settings`. Existing
    /// shards made with different settings are an error that names the file, so that no
    /// mismatched shard is ever reused and none is silently thrown away.
    pub fn open(dir: &Path, settings: &Json) -> Result<ShardStore> {
        let path = dir.join("settings.json");
        let text = settings.dumps(Style::INDENT2) + "\n";
        match std::fs::read_to_string(&path) {
            Ok(existing) if existing == text => {}
            Ok(_) => {
                return Err(Error::data(
                    &path,
                    None,
                    "unfinished shards of this model were made with other settings or other data; \
                     rerun with the same settings, or pass --overwrite to start this model afresh",
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_atomic(&path, &text)?,
            Err(e) => return Err(Error::io(&path, e)),
        }
        Ok(ShardStore { dir: dir.to_path_buf() })
    }

    /// The file of shard `index` of `part` (`id`, `ood`, …).
    pub fn path(&self, kind: ShardKind, part: impl AsRef<str>, index: usize) -> PathBuf {
        let prefix = match kind {
            ShardKind::Generations => "generations",
            ShardKind::Loss => "loss",
        };
        self.dir.join(part.as_ref()).join(format!("{prefix}-{index:05}.jsonl"))
    }

    /// Deletes the store, and `.shards/` when no other model's store is left in it.
    pub fn remove(self) -> Result<()> {
        remove_dir(&self.dir)?;
        if let Some(parent) = self.dir.parent() {
            // Fails, as it should, while other models' shards are there.
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }
}

/// Writes the concatenation of `parts` to `path` (atomically).
pub fn concatenate(parts: &[PathBuf], path: &Path) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    let stage = crate::progress::file_stage("joining", path, parts.len() as u64, "shards");
    for (done, part) in parts.iter().enumerate() {
        stage.set_position(done as u64);
        let reader = BufReader::new(std::fs::File::open(part).map_err(|e| Error::io(part, e))?);
        for line in reader.lines() {
            file.write_line(&line.map_err(|e| Error::io(part, e))?)?;
        }
    }
    file.commit()
}

/// The sampling seed of one shard: `seed` mixed with the part's position (Interplay: ID is part
/// 0, OOD part 1) and the shard index (SplitMix64), so that shards draw from unrelated streams
/// and a resumed shard redraws exactly.
pub fn shard_seed(seed: u64, part: usize, index: usize) -> u64 {
    splitmix64(seed ^ splitmix64(((part as u64) << 40) ^ index as u64))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_guard_the_shards() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ShardStore::dir_for(tmp.path(), "m");
        let a = Json::object([("samples", Json::Int(4))]);
        let store = ShardStore::open(&dir, &a).unwrap();
        assert_eq!(store.path(ShardKind::Loss, "ood", 3), dir.join("ood/loss-00003.jsonl"));
        ShardStore::open(&dir, &a).unwrap();
        let e = ShardStore::open(&dir, &Json::object([("samples", Json::Int(8))])).unwrap_err().to_string();
        assert!(e.contains("settings.json") && e.contains("--overwrite"), "{e}");
        store.remove().unwrap();
        assert!(!dir.exists());
        assert_ne!(shard_seed(0, 0, 0), shard_seed(0, 1, 0));
        assert_ne!(shard_seed(0, 0, 0), shard_seed(0, 0, 1));
        // Pinned: shards kept on disk by earlier runs (OOD is part 1) must redraw identically.
        assert_eq!(shard_seed(7, 1, 3), 0x2cd1_cbea_d31f_fac6);
    }
}
