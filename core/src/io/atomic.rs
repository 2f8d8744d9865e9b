//! Output files and directories that appear whole or not at all: written to a temporary
//! sibling, synced to disk and renamed on commit (the parent directory synced too, so the rename
//! itself survives a power loss), removed if dropped uncommitted. The temporary files and
//! directories a killed process left behind are swept by the next writer of the same name, and
//! those in a run's directory by the next run ([`sweep_partials`]). And removals where "already
//! gone" is fine.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// An output file that only appears under its name when [`AtomicFile::commit`] is called.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Starts writing `path` (its parent directory is created).
    pub fn create(path: &Path) -> Result<Self> {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // (a killed writer's temporary file of this name goes)
        sweep_leftovers(parent, &format!(".{name}{TMP}"), false);
        let tmp = parent.join(format!(".{name}{TMP}{}", std::process::id()));
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            writer: Some(BufWriter::new(file)),
        })
    }

    /// Appends `text`.
    pub fn write_str(&mut self, text: &str) -> Result<()> {
        let writer = self.writer.as_mut().expect("writer present until commit");
        writer
            .write_all(text.as_bytes())
            .map_err(|e| Error::io(&self.tmp, e))
    }

    /// Appends `line` and a newline.
    pub fn write_line(&mut self, line: &str) -> Result<()> {
        self.write_str(line)?;
        self.write_str("\n")
    }

    /// Whether a file already at the final name holds other bytes than those written so far
    /// (false when there is none).
    pub fn replaces_other_contents(&mut self) -> Result<bool> {
        let writer = self.writer.as_mut().expect("writer present until commit");
        writer.flush().map_err(|e| Error::io(&self.tmp, e))?;
        if !self.path.exists() {
            return Ok(false);
        }
        let old = std::fs::read(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let new = std::fs::read(&self.tmp).map_err(|e| Error::io(&self.tmp, e))?;
        Ok(old != new)
    }

    /// Flushes and moves the file to its final name.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("writer present until commit");
        let file = writer
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))?;
        sync_dir(parent_of(&self.path))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_str(contents)?;
    file.commit()
}

/// The marker in the name of a directory being written by [`write_dir_atomically`]:
/// `.<name>.partial-<pid>`.
const PARTIAL: &str = ".partial-";

/// The marker in the name of a file being written by [`AtomicFile`]: `.<name>.tmp<pid>`.
const TMP: &str = ".tmp";

/// Whether no running process has id `pid` (work left under it is nobody's): gone from
/// `/proc`, or this process's own (its earlier work is the caller's to redo). Without `/proc`,
/// only this process's own.
pub fn pid_is_gone(pid: u32) -> bool {
    pid == std::process::id() || (Path::new("/proc/self").exists() && !Path::new("/proc").join(pid.to_string()).exists())
}

/// Whether `path` belongs to the user this process runs as (a leftover of another user's, or
/// of another container's with its own process ids, is not this process's to judge).
pub fn owned_by_this_user(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let uid = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| m.uid());
        uid(path).is_some_and(|owner| Some(owner) == uid(Path::new("/proc/self")))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// Removes, as far as it can (a leftover it cannot remove is left), the entries of `parent`
/// named `<prefix><pid>` (directories if `dirs`, else files) that this user owns and whose
/// process is gone.
fn sweep_leftovers(parent: &Path, prefix: &str, dirs: bool) {
    for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(pid) = name.strip_prefix(prefix).and_then(|pid| pid.parse::<u32>().ok()) else { continue };
        if path.is_dir() == dirs && pid_is_gone(pid) && owned_by_this_user(&path) {
            let _ = if dirs { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        }
    }
}

fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Flushes a directory's entries to disk (a no-op where directories cannot be opened).
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Flushes every file under `dir`, then the directories themselves.
fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path).and_then(|f| f.sync_all()).map_err(|e| Error::io(&path, e))?;
        }
    }
    sync_dir(dir)
}

/// An error unless `dir` is absent or empty: what [`write_dir_atomically`] refuses, for work
/// that should not start when its output cannot be written.
pub fn refuse_non_empty_dir(dir: &Path) -> Result<()> {
    if dir.exists() && std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.next().is_some() {
        return Err(Error::InvalidInput(format!("{} already exists and is not empty; not overwriting it", dir.display())));
    }
    Ok(())
}

/// Runs `write` on a fresh temporary sibling of `dir` (`.<name>.partial-<pid>`), flushes what it
/// wrote to disk, renames it to `dir` and flushes the parent. `dir` must not exist or be an empty
/// directory; on any error the temporary directory is removed and `dir` is untouched. A process
/// killed midway leaves only the temporary directory, which [`sweep_partials`] removes.
pub fn write_dir_atomically(dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    refuse_non_empty_dir(dir)?;
    let parent = parent_of(dir);
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    // (a killed writer's temporary directory of this name goes, this process's own included)
    sweep_leftovers(parent, &format!(".{name}{PARTIAL}"), true);
    let tmp = parent.join(format!(".{name}{PARTIAL}{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = write(&tmp).and_then(|()| sync_tree(&tmp)).and_then(|()| {
        if dir.exists() {
            std::fs::remove_dir(dir).map_err(|e| Error::io(dir, e))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e))?;
        sync_dir(parent)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Removes the temporary directories of [`write_dir_atomically`] in `parent` that no running
/// process is writing ([`pid_is_gone`]): left by a crash (kill -9, out of memory, a panic).
/// Returns the removed directories. (Writing a directory or file sweeps its own name's.)
pub fn sweep_partials(parent: &Path) -> Result<Vec<PathBuf>> {
    if !parent.is_dir() {
        return Ok(Vec::new());
    }
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(parent).map_err(|e| Error::io(parent, e))? {
        let path = entry.map_err(|e| Error::io(parent, e))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let pid = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(PARTIAL))
            .and_then(|(_, pid)| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| path.is_dir() && pid_is_gone(pid)) {
            remove_dir(&path)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Removes `path`; a missing file is fine.
pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// Removes `dir` and everything in it; a missing directory is fine.
pub fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(dir, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_appear_whole_and_crash_leftovers_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("checkpoint-3");
        write_dir_atomically(&dir, |d| std::fs::write(d.join("a.txt"), "a").map_err(|e| Error::io(d, e))).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "a");
        // A failed write leaves nothing; an existing directory is never overwritten.
        let failed = tmp.path().join("checkpoint-4");
        assert!(write_dir_atomically(&failed, |_| Err(Error::InvalidInput("boom".into()))).is_err());
        assert!(!failed.exists());
        assert!(write_dir_atomically(&dir, |_| Ok(())).unwrap_err().to_string().contains("not overwriting"));

        // Leftovers of dead processes (pid 0 never names a user process) and of this one go;
        // a live process's (pid 1) and anything else stay.
        let dead = tmp.path().join(".checkpoint-5.partial-0");
        let own = tmp.path().join(format!(".checkpoint-6.partial-{}", std::process::id()));
        let live = tmp.path().join(".checkpoint-7.partial-1");
        let other = tmp.path().join(".checkpoint-8.partial-x");
        for d in [&dead, &own, &live, &other] {
            std::fs::create_dir_all(d.join("sub")).unwrap();
        }
        let mut removed = sweep_partials(tmp.path()).unwrap();
        removed.sort();
        let mut expected = vec![dead.clone(), own.clone()];
        expected.sort();
        if !Path::new("/proc/self").exists() {
            expected.retain(|p| p == &own);
        }
        assert_eq!(removed, expected);
        assert!(live.exists() && other.exists() && dir.join("a.txt").exists());
    }

    /// A rerun writing the same directory or file removes what a killed writer of that name
    /// left; a live writer's and other names' stay.
    #[test]
    fn a_rerun_sweeps_its_own_name_s_leftovers() {
        if !Path::new("/proc/self").exists() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (dead_dir, live_dir, other_dir) = (tmp.path().join(".model.partial-0"), tmp.path().join(".model.partial-1"), tmp.path().join(".other.partial-0"));
        let (dead_file, other_file) = (tmp.path().join(".rows.jsonl.tmp0"), tmp.path().join(".more.jsonl.tmp0"));
        for d in [&dead_dir, &live_dir, &other_dir] {
            std::fs::create_dir_all(d.join("sub")).unwrap();
        }
        for f in [&dead_file, &other_file] {
            std::fs::write(f, "x").unwrap();
        }
        write_dir_atomically(&tmp.path().join("model"), |_| Ok(())).unwrap();
        assert!(!dead_dir.exists() && live_dir.exists() && other_dir.exists());
        let file = AtomicFile::create(&tmp.path().join("rows.jsonl")).unwrap();
        drop(file);
        assert!(!dead_file.exists() && other_file.exists());
    }

    #[test]
    fn uncommitted_files_vanish() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out/y.txt");
        let mut file = AtomicFile::create(&out).unwrap();
        file.write_line("partial").unwrap();
        drop(file);
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(dir.path().join("out")).unwrap().count(), 0);
        write_atomic(&out, "whole\n").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "whole\n");
    }
}
