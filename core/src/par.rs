//! Work spread over the machine's cores with scoped threads, results in input order, so what
//! is computed does not depend on how many threads computed it. (Plain `std`: kiln-core's
//! model-only build has no thread pool; on a target without threads it runs inline.)

use std::num::NonZeroUsize;

/// Threads to use: the cores this process may run on (cgroup and affinity aware), at least 1.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// Runs `job` on a thread of rayon's global pool while this thread passes the events it sends
/// to `on_event` (so `on_event` need not be `Send`); returns when the job has ended. On the
/// pool a parallel loop of the fused kernels wakes at most the pool's other threads, not also a
/// thread that waits outside it: a decoding step runs about 85 such loops, and `kiln bench`'s
/// 100M decode went from about 480 context switches a step to 140. While the job runs, the
/// pool's other threads stay awake (`awake::KeepAwake` in this file) rather than sleep between
/// its loops: the same benchmark's decoding went from 337 to 361 tokens/s (five alternating runs each, Intel
/// Xeon, 2 cores) and its context switches from 48k to 13k a run with a first version that
/// napped where this one returns (17k). Inline where already on the pool, and without the
/// `flex` feature (no pool). The job runs on another thread: keep thread-bound
/// state (a GPU backend's stream, `kiln_backends::device::guard`) out of it. If `on_event`
/// panics, the panic comes out after the job has ended (its later events dropped).
pub fn on_pool<R: Send, E: Send>(job: impl FnOnce(&mut dyn FnMut(E)) -> R + Send, mut on_event: impl FnMut(E)) -> R {
    #[cfg(feature = "flex")]
    if rayon::current_thread_index().is_none() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut out = None;
        // Before the job exists, so that an idle thread takes its copy before any of the job's
        // tasks (see `awake::KeepAwake`). Dropped when the job has ended, however it ended.
        let _awake = awake::KeepAwake::start();
        rayon::in_place_scope(|s| {
            let out = &mut out;
            s.spawn(move |_| {
                let _job = awake::InJob::enter();
                *out = Some(job(&mut |e| {
                    let _ = tx.send(e);
                }));
            });
            rx.into_iter().for_each(&mut on_event);
        });
        return out.expect("the scope ends after its job");
    }
    // Inline on a pool thread: a copy this thread takes while the job waits returns at once.
    #[cfg(feature = "flex")]
    let _job = awake::InJob::enter();
    job(&mut on_event)
}

/// Keeping the pool's threads awake during an [`on_pool`] job (the `flex` feature's pool).
#[cfg(feature = "flex")]
mod awake {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// Keeps the pool's threads running its tasks while one [`on_pool`](super::on_pool) job runs, instead of
    /// letting them fall asleep between the job's parallel loops: waking a sleeping thread costs a
    /// system call and a scheduler wake-up per loop, during which the job's thread works alone.
    ///
    /// Every pool thread gets one copy of [`stay_awake`] (`rayon::spawn_broadcast`, queued before
    /// the job, so an idle thread takes its copy first and runs the job's tasks inside it, through
    /// `rayon::yield_now`). A copy holds up whatever lies below it on its thread's stack, so it
    /// returns at once on a thread that runs an `on_pool` job ([`InJob`]: the job's own thread, and
    /// a concurrent job's), when the job is done, after [`IDLE_LIMIT`] without a task, and after
    /// [`LIFETIME`] in all. The last two bound every other case: a thread that was already past its
    /// broadcast queue when the copies came, stole one of the job's tasks and then took its copy
    /// while waiting inside that task; or a copy taken while waiting inside other pool work. Such a
    /// copy lets that work go on once the pool has had nothing to run for [`IDLE_LIMIT`], or at the
    /// latest after [`LIFETIME`] (a stall, never a hang). Only one job at a time keeps the threads
    /// awake; a second [`on_pool`](super::on_pool) while one runs goes without.
    pub(super) struct KeepAwake(Arc<AtomicBool>);

    /// Whether some [`on_pool`](super::on_pool) job has the threads kept awake.
    static KEEPING_AWAKE: AtomicBool = AtomicBool::new(false);

    impl KeepAwake {
        /// `None` while another job has the threads.
        pub(super) fn start() -> Option<Self> {
            if KEEPING_AWAKE.swap(true, Ordering::AcqRel) {
                return None;
            }
            // Built first, so that a panic below still releases the flag.
            let awake = Self(Arc::new(AtomicBool::new(false)));
            let done = awake.0.clone();
            rayon::spawn_broadcast(move |_| stay_awake(&done));
            Some(awake)
        }
    }

    impl Drop for KeepAwake {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
            KEEPING_AWAKE.store(false, Ordering::Release);
        }
    }

    thread_local! {
        /// Whether this thread is running an [`on_pool`](super::on_pool) job (anywhere on its stack).
        static IN_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Marks this thread as running an [`on_pool`](super::on_pool) job until dropped.
    pub(super) struct InJob(bool);

    impl InJob {
        pub(super) fn enter() -> Self {
            Self(IN_JOB.with(|c| c.replace(true)))
        }
    }

    impl Drop for InJob {
        fn drop(&mut self) {
            IN_JOB.with(|c| c.set(self.0));
        }
    }

    /// Runs the pool's tasks on this thread until `done`, on the terms of [`KeepAwake`].
    fn stay_awake(done: &AtomicBool) {
        let started = Instant::now();
        let mut idle_since = started;
        while !done.load(Ordering::Acquire) && !IN_JOB.with(|c| c.get()) && started.elapsed() < LIFETIME {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => idle_since = Instant::now(),
                _ if idle_since.elapsed() > IDLE_LIMIT => return,
                _ => std::hint::spin_loop(),
            }
        }
    }

    /// How long a copy of [`stay_awake`] runs without finding a task before it returns: well over
    /// a decoding step's gaps between loops and the few milliseconds a generation takes to set up
    /// before its first loop (with 2 ms, `kiln bench`'s 100M decode had as many context switches
    /// as without keeping awake, 47k a run; with 20 ms, 17k).
    const IDLE_LIMIT: Duration = Duration::from_millis(20);

    /// How long a copy of [`stay_awake`] runs at most: the bound on how long it can hold up what
    /// lies below it while other pool work keeps it from ever idling for [`IDLE_LIMIT`] (another
    /// caller's parallel loops). A longer generation goes on without being kept awake.
    const LIFETIME: Duration = Duration::from_secs(10);
}

/// `f` over `items`, in contiguous chunks on up to [`threads`] threads; results in `items`' order.
pub fn map_in_order<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let chunk = items.len().div_ceil(threads()).max(1);
    if chunk >= items.len() {
        return items.iter().map(f).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks(chunk).map(|part| s.spawn(move || part.iter().map(f).collect::<Vec<R>>())).collect();
        parts.into_iter().flat_map(|part| part.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_on_the_pool_returns_its_value_and_sends_its_events_in_order() {
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new())); // not Send
        let sum: u32 = on_pool(
            |send| {
                #[cfg(feature = "flex")]
                assert!(rayon::current_thread_index().is_some(), "the job runs on the pool");
                (0..100u32).inspect(|&i| send(i)).sum()
            },
            |e| seen.borrow_mut().push(e),
        );
        assert_eq!(sum, 4950);
        assert_eq!(*seen.borrow(), (0..100).collect::<Vec<_>>());
    }

    /// The job's parallel loops give the right sums, also with jobs from several threads at
    /// once (one of them keeps the threads awake); a panic in the job comes out of `on_pool`
    /// and the next job runs. (A hang here would stall the test run, not fail it.)
    #[test]
    #[cfg(feature = "flex")]
    fn jobs_with_parallel_loops_end_and_a_panic_comes_out() {
        use rayon::prelude::*;
        let job = |_: &mut dyn FnMut(())| (0..200u64).map(|i| (0..1000u64).into_par_iter().map(|j| i * j).sum::<u64>()).sum::<u64>();
        let expected = (0..200u64).sum::<u64>() * 499_500;
        std::thread::scope(|s| {
            let callers: Vec<_> = (0..4).map(|_| s.spawn(|| (0..10).map(|_| on_pool(job, |_| {})).collect::<Vec<_>>())).collect();
            for caller in callers {
                assert!(caller.join().expect("no panic").iter().all(|&sum| sum == expected));
            }
        });
        let panicked = std::panic::catch_unwind(|| on_pool(|_| (0..1000u64).into_par_iter().map(|i| assert!(i < 999, "the job's panic")).count(), |_: ()| {}));
        let payload = panicked.expect_err("the job panicked");
        let message = payload.downcast_ref::<&str>().map(|m| m.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
        assert_eq!(message.as_deref(), Some("the job's panic"));
        assert_eq!(on_pool(job, |_| {}), expected);
    }

    #[test]
    fn keeps_the_order_of_the_items() {
        let items: Vec<u64> = (0..10_007).collect();
        let squares = map_in_order(&items, |x| x * x);
        assert_eq!(squares, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(map_in_order(&[] as &[u64], |x| *x), Vec::<u64>::new());
        assert_eq!(map_in_order(&[3u64], |x| x + 1), vec![4]);
    }
}
