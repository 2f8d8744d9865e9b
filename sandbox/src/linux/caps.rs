//! Dropping every capability in the forked child (async-signal-safe: system calls only), so a
//! program that still runs as root — no uid could be dropped to, as in rootless containers, or the
//! uid layer was left off — has no root rights: the bounding set emptied and `SECBIT_NOROOT`
//! locked (so `execve` as root grants nothing), the ambient set cleared, then the permitted,
//! effective and inheritable sets emptied with `capset`.

use std::io;

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;
const CAP_SETPCAP: u32 = 8;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// Drops every capability of the calling process (in its user namespace). The bounding set and
/// the securebits need `CAP_SETPCAP` and are left alone without it (a process without it has no
/// capabilities to lose at `execve` either: non-root, or a uid that was already dropped).
///
/// # Safety
/// Only system calls on stack memory; callable after `fork`.
pub(crate) unsafe fn drop_all() -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget/capset/prctl with a header and data on the stack.
    unsafe {
        if libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) != 0 {
            return Err(last_error());
        }
        if data[0].effective & (1 << CAP_SETPCAP) != 0 {
            let bits = libc::SECBIT_NOROOT
                | libc::SECBIT_NOROOT_LOCKED
                | libc::SECBIT_NO_SETUID_FIXUP
                | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
                | libc::SECBIT_KEEP_CAPS_LOCKED;
            if libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(last_error());
            }
            // every capability this kernel knows (EINVAL past the last one)
            for cap in 0..64 as libc::c_ulong {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    let e = last_error();
                    if e.raw_os_error() == Some(libc::EINVAL) {
                        break;
                    }
                    return Err(e);
                }
            }
        }
        // EINVAL: a kernel before 4.3, which has no ambient set
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
            && last_error().raw_os_error() != Some(libc::EINVAL)
        {
            return Err(last_error());
        }
        let empty = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        header.version = CAP_VERSION_3;
        header.pid = 0;
        if libc::syscall(libc::SYS_capset, &raw mut header, empty.as_ptr()) != 0 {
            return Err(last_error());
        }
    }
    Ok(())
}
