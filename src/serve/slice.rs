//! A short scheduler slice for the thread that answers reads.
//!
//! A job's workers run flat out; the server's thread sleeps until a request
//! comes and then has a few microseconds of work. When the cores are all
//! busy, Linux's scheduler (EEVDF, since 6.6) lets a woken thread run only
//! when its virtual deadline comes first, and that deadline is one slice
//! (0.7 ms × (1 + log₂ cores) by default) after it woke: a read waits behind
//! a worker's slice, and under load behind several. Since Linux 6.12 a
//! thread may ask for a shorter slice (`sched_setattr` with `sched_runtime`
//! for `SCHED_OTHER`, no privilege needed): its deadline comes sooner, so it
//! preempts a worker as soon as it wakes, and it gets no more of the CPU
//! over time than before (the share is still its weight's). Older kernels
//! ignore the field; elsewhere this does nothing.

/// The slice the server's thread asks for: the kernel's smallest (0.1 ms).
pub(crate) const SERVER_SLICE_NS: u64 = 100_000;

/// Asks the scheduler for slices of `ns` nanoseconds for the calling thread,
/// keeping its policy (`SCHED_OTHER`) and nice value. Returns whether the
/// kernel took the request (it clamps `ns` to 0.1–100 ms).
#[cfg(target_os = "linux")]
pub(crate) fn request_slice(ns: u64) -> bool {
    /// `struct sched_attr` as `linux/sched/types.h` has it (version 1, 56 bytes).
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        sched_policy: u32,
        sched_flags: u64,
        sched_nice: i32,
        sched_priority: u32,
        sched_runtime: u64,
        sched_deadline: u64,
        sched_period: u64,
        sched_util_min: u32,
        sched_util_max: u32,
    }
    // SAFETY: `getpriority` takes no pointers (on Linux, process 0 is the
    // calling thread); clearing errno first tells a nice of -1 from an error.
    let nice = unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            return false;
        }
        nice
    };
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: ns,
        sched_deadline: 0,
        sched_period: 0,
        sched_util_min: 0,
        sched_util_max: 0,
    };
    // SAFETY: `attr` is a valid `sched_attr` of the size it declares, alive
    // for the call; pid 0 is the calling thread.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0 }
}

/// Does nothing where the scheduler has no per-thread slice.
#[cfg(not(target_os = "linux"))]
pub(crate) fn request_slice(_ns: u64) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The slice this thread has, from `/proc` (`se.slice`, in ns), where the
    /// kernel shows it.
    fn slice() -> Option<u64> {
        let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
        line.split(':').nth(1)?.trim().parse().ok()
    }

    /// Whether this kernel takes custom slices (6.12 and later).
    fn custom_slices() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (6, 12)
    }

    #[test]
    fn the_thread_gets_the_slice_it_asks_for_and_keeps_its_nice() {
        std::thread::spawn(|| {
            // SAFETY: raising one's own nice value needs no privilege.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) };
            let checked = custom_slices() && slice().is_some();
            let taken = request_slice(SERVER_SLICE_NS);
            if checked {
                assert!(taken, "sched_setattr refused the slice");
                assert_eq!(slice(), Some(SERVER_SLICE_NS));
            }
            // SAFETY: no pointers.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            assert_eq!(nice, 3, "the nice value is kept");
            assert!(request_slice(1_000_000) || !checked);
            if checked {
                assert_eq!(slice(), Some(1_000_000));
            }
        })
        .join()
        .unwrap();
    }
}
