//! The size of a plain scratch directory (used where no private tmpfs can be mounted), checked by
//! the host while the run goes on: every [`CHECK_EVERY`] the tree's allocated blocks and entries
//! are summed, and a run over the tmpfs's bounds (the file-size limit in bytes, 4096 entries) is
//! killed. `fallocate` is denied by seccomp, so between two checks a program can only add what
//! `write` gets through in that time (kept by the page cache; removed after the run).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a plain scratch directory is measured during a run.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(20);

/// The bounds of one scratch directory.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    pub dir: PathBuf,
    /// Bytes allocated on disk (`st_blocks`), all files together.
    pub bytes: u64,
    /// Files, directories and links together.
    pub entries: usize,
}

impl Quota {
    /// Whether the tree holds more than the quota. A directory the host cannot read even after
    /// opening its mode counts as over (it could hide anything).
    pub(crate) fn exceeded(&self) -> bool {
        let (mut bytes, mut entries) = (0u64, 0usize);
        let mut dirs = vec![self.dir.clone()];
        while let Some(d) = dirs.pop() {
            let Ok(list) = read_dir_opening(&d) else {
                return true;
            };
            for entry in list {
                let Ok(entry) = entry else { return true };
                entries += 1;
                let Ok(m) = std::fs::symlink_metadata(entry.path()) else {
                    continue; // removed meanwhile
                };
                bytes = bytes.saturating_add(m.blocks().saturating_mul(512));
                if bytes > self.bytes || entries > self.entries {
                    return true;
                }
                if m.is_dir() {
                    dirs.push(entry.path());
                }
            }
        }
        false
    }
}

/// Lists `dir`, first making it readable if the program made it unreadable (kiln owns it, or is
/// root).
fn read_dir_opening(dir: &Path) -> std::io::Result<std::fs::ReadDir> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            std::fs::read_dir(dir)
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_entries_over_the_quota_are_seen_even_in_hidden_directories() {
        let dir = std::env::temp_dir().join(format!("kiln-quota-{}", std::process::id()));
        let _ = crate::fresh::remove_tree(&dir);
        std::fs::create_dir(&dir).unwrap();
        let q = |bytes, entries| Quota {
            dir: dir.clone(),
            bytes,
            entries,
        };
        assert!(!q(0, 0).exceeded(), "an empty directory");
        let hidden = dir.join("d");
        std::fs::create_dir(&hidden).unwrap();
        std::fs::write(hidden.join("f"), vec![1u8; 1 << 20]).unwrap();
        std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(q(1 << 19, 100).exceeded(), "1 MiB over 512 KiB");
        assert!(!q(2 << 20, 100).exceeded(), "1 MiB under 2 MiB");
        assert!(q(2 << 20, 1).exceeded(), "two entries over one");
        crate::fresh::remove_tree(&dir).unwrap();
    }
}
