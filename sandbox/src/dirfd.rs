//! Directories a program can change while kiln reads them, walked by descriptor rather than by
//! path: every name is opened relative to its parent's descriptor with `O_NOFOLLOW`, so a
//! directory swapped for a symbolic link mid-walk is never followed; a directory the program made
//! unreadable is opened up through a descriptor of that very directory (`O_PATH`, then
//! `/proc/self/fd/N`), never through a path the program could redirect to a file of kiln's.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An open directory.
pub(crate) struct Dir(OwnedFd);

/// A name in a [`Dir`] and what it was when listed (`lstat`: links are not followed).
pub(crate) struct Entry {
    pub name: CString,
    pub stat: libc::stat,
}

impl Entry {
    pub(crate) fn is_dir(&self) -> bool {
        self.stat.st_mode & libc::S_IFMT == libc::S_IFDIR
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn open_at(at: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; the descriptor returned is ours.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Dir {
    /// Opens the directory `path` (its last component must not be a link), opening up its mode
    /// when it is unreadable.
    pub(crate) fn open(path: &Path) -> io::Result<Dir> {
        Self::open_in(libc::AT_FDCWD, &cstring(path.as_os_str().as_bytes())?)
    }

    /// Opens the directory `name` of this one (never a link), opening up its mode when it is
    /// unreadable.
    pub(crate) fn child(&self, name: &CStr) -> io::Result<Dir> {
        Self::open_in(self.0.as_raw_fd(), name)
    }

    fn open_in(at: RawFd, name: &CStr) -> io::Result<Dir> {
        match open_at(at, name, libc::O_RDONLY | libc::O_DIRECTORY) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                // a descriptor of the directory itself (O_PATH needs no rights), then its mode
                // and a readable descriptor through it: both reach that inode, whatever the name
                // now points to
                let path_fd = open_at(at, name, libc::O_PATH | libc::O_DIRECTORY)?;
                let magic = cstring(format!("/proc/self/fd/{}", path_fd.as_raw_fd()).as_bytes())?;
                // SAFETY: a NUL-terminated path.
                if unsafe { libc::chmod(magic.as_ptr(), 0o700) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // (no O_NOFOLLOW here: the magic link is the directory itself)
                // SAFETY: as in `open_at`.
                let fd = unsafe { libc::open(magic.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: a fresh descriptor.
                Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
            }
            r => r.map(Dir),
        }
    }

    /// Sets this directory's own mode.
    pub(crate) fn set_mode(&self, mode: u32) -> io::Result<()> {
        // SAFETY: our descriptor.
        if unsafe { libc::fchmod(self.0.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The names in this directory with their `lstat`; names removed while it is listed are
    /// left out.
    pub(crate) fn entries(&self) -> io::Result<Vec<Entry>> {
        // SAFETY: a duplicate for `fdopendir`, which owns (and `closedir` closes) it; it shares
        // the offset with ours, so the listing starts from the beginning.
        let dup = unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a directory descriptor we own.
        let stream = unsafe { libc::fdopendir(dup) };
        if stream.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: still ours when fdopendir fails.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // SAFETY: a valid stream.
        unsafe { libc::rewinddir(stream) };
        let mut names = Vec::new();
        let result = loop {
            // SAFETY: errno is thread-local; readdir's entry lives until the next call.
            unsafe { *libc::__errno_location() = 0 };
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let errno = io::Error::last_os_error();
                break if errno.raw_os_error().unwrap_or(0) == 0 { Ok(()) } else { Err(errno) };
            }
            // SAFETY: d_name is NUL-terminated within the entry.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                names.push(name.to_owned());
            }
        };
        // SAFETY: the stream we opened.
        unsafe { libc::closedir(stream) };
        result?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            // SAFETY: a zeroed stat filled by fstatat.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::fstatat(self.0.as_raw_fd(), name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) };
            if r == 0 {
                out.push(Entry { name, stat });
            } else if io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(out)
    }

    /// Removes `entry` (a directory with everything beneath it; a link itself, never its target).
    pub(crate) fn remove(&self, entry: &Entry) -> io::Result<()> {
        let mut flags = 0;
        if entry.is_dir() {
            let child = self.child(&entry.name)?;
            child.set_mode(0o700)?; // writable, to unlink its entries
            child.remove_contents()?;
            flags = libc::AT_REMOVEDIR;
        }
        // SAFETY: a NUL-terminated name relative to our descriptor.
        if unsafe { libc::unlinkat(self.0.as_raw_fd(), entry.name.as_ptr(), flags) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes everything in this directory.
    pub(crate) fn remove_contents(&self) -> io::Result<()> {
        for entry in self.entries()? {
            self.remove(&entry)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::fs::PermissionsExt;

    fn name(s: &OsStr) -> io::Result<CString> {
        cstring(s.as_bytes())
    }

    #[test]
    fn an_unreadable_directory_is_opened_up_and_links_are_never_followed() {
        let root = std::env::temp_dir().join(format!("kiln-dirfd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("d/sub")).unwrap();
        std::fs::write(root.join("d/sub/f"), "x").unwrap();
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("d/link")).unwrap();
        std::fs::set_permissions(root.join("d/sub"), std::fs::Permissions::from_mode(0o0)).unwrap();
        let d = Dir::open(&root.join("d")).unwrap();
        let mut names: Vec<_> = d.entries().unwrap().into_iter().map(|e| e.name.into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["link", "sub"]);
        assert_eq!(d.child(&name(OsStr::new("sub")).unwrap()).unwrap().entries().unwrap().len(), 1);
        let link = d.child(&name(OsStr::new("link")).unwrap());
        assert!(link.is_err(), "a link to a directory is not opened");
        d.remove_contents().unwrap();
        assert_eq!(d.entries().unwrap().len(), 0);
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750, "the link's target is untouched");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
