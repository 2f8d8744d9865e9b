//! One writer per output directory: a run holds `<dir>/.kiln.lock` (an advisory `flock`, which
//! the kernel releases when the process ends, however it ends) for as long as it writes there,
//! so a second run started on the same directory stops before it touches anything.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// The lock file's name inside the output directory.
pub const LOCK_FILE: &str = ".kiln.lock";

/// Holds the lock of an output directory until dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes the lock of `dir` (created if missing), or says which process holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).map_err(|e| Error::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => {
            // The holder's pid, for the message another run prints.
            file.set_len(0).and_then(|()| writeln!(file, "{}", std::process::id())).map_err(|e| Error::io(&path, e))?;
            Ok(DirLock { _file: file })
        }
        Err(TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let pid = if holder.is_empty() { String::new() } else { format!(" (pid {holder})") };
            Err(Error::InvalidInput(format!(
                "{} is being written by another kiln run{pid}; wait for it to end or choose another output directory",
                dir.display()
            )))
        }
        Err(TryLockError::Error(e)) => Err(Error::io(&path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_until_the_first_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_dir(dir.path()).unwrap();
        let err = lock_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is being written by another kiln run"), "{err}");
        assert!(err.contains(&format!("(pid {})", std::process::id())), "{err}");
        drop(first);
        lock_dir(dir.path()).unwrap();
    }
}
