//! What every run starts from, checked before each run and rebuilt when a program changed it, so
//! that a hostile program can break at most its own test, never the next one's:
//!
//! - the harness directory (shared read-only by all runs, named on every run's command line): its
//!   modes, sizes and times are compared with those recorded when it was written; any change and
//!   it is written and compiled again;
//! - a plain scratch directory (used where no private tmpfs can be mounted): emptied even of
//!   directories a program made unreadable (they are opened up first), its mode and owner set
//!   again; if that fails, it is moved aside and made anew.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::SandboxError;
use crate::dirfd::Dir;

/// The harness's own file name (imported as the module `kiln_lcb`).
const HARNESS_FILE: &str = "kiln_lcb.py";

/// What a file or directory looked like when kiln wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    mode: u32,
    uid: u32,
    len: u64,
    mtime: (i64, i64),
}

fn stamp(p: &Path) -> std::io::Result<Stamp> {
    let m = std::fs::symlink_metadata(p)?;
    let len = if m.is_dir() { 0 } else { m.len() };
    Ok(Stamp {
        mode: m.mode(),
        uid: m.uid(),
        len,
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// The harness directory and what its entries must look like.
pub(crate) struct HarnessDir {
    dir: PathBuf,
    python: PathBuf,
    source: &'static str,
    /// Every path of the directory (itself included) with its stamp.
    expected: Mutex<Vec<(PathBuf, Stamp)>>,
}

impl HarnessDir {
    /// Writes the harness `source` into `dir` (created) and compiles it with `python`.
    pub(crate) fn create(
        dir: PathBuf,
        python: &Path,
        source: &'static str,
    ) -> Result<HarnessDir, SandboxError> {
        let h = HarnessDir {
            dir,
            python: python.to_path_buf(),
            source,
            expected: Mutex::new(Vec::new()),
        };
        let stamps = h.install()?;
        *h.expected.lock().unwrap_or_else(|e| e.into_inner()) = stamps;
        Ok(h)
    }

    /// The directory programs are given (`sys.argv[1]`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks that nothing changed since the harness was written, and writes it again if
    /// something did. Returns whether it had to.
    pub(crate) fn ensure(&self) -> Result<bool, SandboxError> {
        let mut expected = self.expected.lock().unwrap_or_else(|e| e.into_inner());
        let intact = expected
            .iter()
            .all(|(p, want)| stamp(p).is_ok_and(|got| got == *want));
        if intact {
            return Ok(false);
        }
        *expected = self.install()?;
        Ok(true)
    }

    /// (Re)writes the directory: mode 0755, the source (0644, replaced atomically), its bytecode.
    fn install(&self) -> Result<Vec<(PathBuf, Stamp)>, SandboxError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |e| SandboxError::io(p, e)
        };
        let dir = &self.dir;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        set_mode(dir, 0o755).map_err(io(dir))?;
        let file = dir.join(HARNESS_FILE);
        let tmp = dir.join(format!(".{HARNESS_FILE}.new"));
        std::fs::write(&tmp, self.source).map_err(io(&tmp))?;
        set_mode(&tmp, 0o644).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &file).map_err(io(&file))?;
        compile(&self.python, &file)?;
        let mut paths = vec![dir.clone(), file];
        let cache = dir.join("__pycache__");
        set_mode(&cache, 0o755).map_err(io(&cache))?;
        paths.push(cache.clone());
        for entry in std::fs::read_dir(&cache).map_err(io(&cache))? {
            let p = entry.map_err(io(&cache))?.path();
            set_mode(&p, 0o644).map_err(io(&p))?;
            paths.push(p);
        }
        paths
            .into_iter()
            .map(|p| stamp(&p).map(|s| (p.clone(), s)).map_err(io(&p)))
            .collect()
    }
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

/// Compiles the harness to bytecode next to it (our own file, compiled by the interpreter outside
/// the sandbox; the runs only read it).
fn compile(python: &Path, harness: &Path) -> Result<(), SandboxError> {
    let out = std::process::Command::new(python)
        .args([
            "-I",
            "-S",
            "-c",
            "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)",
        ])
        .arg(harness)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| SandboxError::Spawn(format!("{}: {e}", python.display())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(SandboxError::Spawn(format!(
            "compiling the harness: {}",
            err.trim()
        )));
    }
    Ok(())
}

/// Makes a plain scratch directory empty, mode 0700 and owned by `owner` (when kiln is root)
/// again. If it cannot be emptied, it is moved aside (`<dir>.broken<n>`, removed as far as
/// possible) and made anew. The run that used it must have ended (its process group is dead).
pub(crate) fn renew_scratch(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    if set_mode(dir, 0o700).is_err() || remove_contents(dir).is_err() {
        static BROKEN: AtomicUsize = AtomicUsize::new(0);
        let n = BROKEN.fetch_add(1, Ordering::Relaxed);
        let mut aside = dir.as_os_str().to_owned();
        aside.push(format!(".broken{n}"));
        let aside = PathBuf::from(aside);
        if dir.exists() || dir.is_symlink() {
            std::fs::rename(dir, &aside)?;
            let _ = remove_tree(&aside);
        }
        std::fs::create_dir(dir)?;
    }
    set_mode(dir, 0o700)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Removes `path` with everything beneath it, opening up directories a program made unreadable
/// (by descriptor: [`crate::dirfd`]).
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(path)?;
    if m.is_dir() {
        let dir = Dir::open(path)?;
        dir.set_mode(0o700)?;
        dir.remove_contents()?;
        std::fs::remove_dir(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// Removes everything inside the directory `dir` (symbolic links are removed, never followed).
pub(crate) fn remove_contents(dir: &Path) -> std::io::Result<()> {
    Dir::open(dir)?.remove_contents()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kiln-fresh-{tag}-{}", std::process::id()));
        let _ = remove_tree(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn a_scratch_directory_with_unreadable_directories_is_emptied() {
        let root = temp("scratch");
        let slot = root.join("slot");
        std::fs::create_dir(&slot).unwrap();
        // what a program can leave: a directory it cannot list, one it cannot enter, a file
        // without rights, a link to a file outside
        for (d, mode) in [("wx", 0o300), ("none", 0o000)] {
            let p = slot.join(d);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("f"), "x").unwrap();
            std::fs::create_dir(p.join("sub")).unwrap();
            set_mode(&p.join("sub"), 0).unwrap();
            set_mode(&p, mode).unwrap();
        }
        std::fs::write(slot.join("f0"), "x").unwrap();
        set_mode(&slot.join("f0"), 0).unwrap();
        let outside = root.join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, slot.join("link")).unwrap();
        set_mode(&slot, 0).unwrap();
        renew_scratch(&slot, None).unwrap();
        assert_eq!(std::fs::read_dir(&slot).unwrap().count(), 0);
        let mode = std::fs::metadata(&slot).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        remove_tree(&root).unwrap();
    }

    #[test]
    fn a_changed_harness_is_written_again() {
        let root = temp("harness");
        let python = crate::python::find(None, false).unwrap().0.path;
        let h = HarnessDir::create(root.join("harness"), &python, "X = 1\n").unwrap();
        assert!(!h.ensure().unwrap(), "an untouched harness is kept");
        let file = h.dir().join(HARNESS_FILE);
        set_mode(h.dir(), 0).unwrap();
        assert!(h.ensure().unwrap());
        let times = std::fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_times(times)
            .unwrap();
        assert!(h.ensure().unwrap());
        std::fs::write(&file, "").unwrap();
        assert!(h.ensure().unwrap());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "X = 1\n");
        assert!(!h.ensure().unwrap());
        remove_tree(&root).unwrap();
    }
}
