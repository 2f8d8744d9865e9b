//! Output files that appear whole or not at all: written to a temporary sibling, synced and
//! renamed on commit, removed if dropped uncommitted. And removals where "already gone" is fine.

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
        let tmp = parent.join(format!(".{name}.tmp{}", std::process::id()));
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

    /// Flushes and moves the file to its final name.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("writer present until commit");
        let file = writer
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))
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
