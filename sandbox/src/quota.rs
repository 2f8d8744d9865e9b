//! The size of a plain scratch directory (used where no private tmpfs can be mounted), checked by
//! the host while the run goes on: every [`CHECK_EVERY`] the tree's allocated blocks and entries
//! are summed, and a run over the tmpfs's bounds (the file-size limit in bytes, 4096 entries) is
//! killed. `fallocate` is denied by seccomp, so between two checks a program can only add what
//! `write` gets through in that time (kept by the page cache; removed after the run); so are
//! `unlink`, `rename` and `O_TMPFILE`, so every block a run writes is in a file the tree shows.
//! The tree is walked by descriptor ([`crate::dirfd`]): a name swapped for a link while it is
//! measured makes kiln follow nothing.

use std::path::PathBuf;
use std::time::Duration;

use crate::dirfd::Dir;

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
        let Ok(root) = Dir::open(&self.dir) else {
            return true;
        };
        let mut dirs = vec![root];
        while let Some(d) = dirs.pop() {
            let Ok(list) = d.entries() else {
                return true;
            };
            for entry in list {
                entries += 1;
                bytes = bytes.saturating_add((entry.stat.st_blocks as u64).saturating_mul(512));
                if bytes > self.bytes || entries > self.entries {
                    return true;
                }
                if entry.is_dir() {
                    match d.child(&entry.name) {
                        Ok(child) => dirs.push(child),
                        // removed, or swapped for a link, meanwhile: the next check sees it
                        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)) => {}
                        Err(_) => return true,
                    }
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
