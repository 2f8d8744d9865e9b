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
/// pool's other threads stay awake ([`KeepAwake`]) rather than sleep between its loops: the
/// same benchmark's context switches fell from 48k to 13k a run, decoding 337 to 361 tokens/s
/// (five alternating runs each, Intel Xeon, 2 cores). Inline where already on the pool, and
/// without the `flex` feature (no pool). The job runs on another thread: keep thread-bound
/// state (a GPU backend's stream, `kiln_backends::device::guard`) out of it. If `on_event`
/// panics, the panic comes out after the job has ended (its later events dropped).
pub fn on_pool<R: Send, E: Send>(job: impl FnOnce(&mut dyn FnMut(E)) -> R + Send, mut on_event: impl FnMut(E)) -> R {
    #[cfg(feature = "flex")]
    if rayon::current_thread_index().is_none() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut out = None;
        // Before the job exists, so that every thread takes its copy before any of the job's
        // tasks (see `KeepAwake`). Dropped when the job has ended, however it ended.
        let awake = KeepAwake::start();
        rayon::in_place_scope(|s| {
            let (out, awake) = (&mut out, &awake);
            s.spawn(move |_| {
                if let Some(awake) = awake {
                    awake.job_started();
                }
                *out = Some(job(&mut |e| {
                    let _ = tx.send(e);
                }));
            });
            rx.into_iter().for_each(&mut on_event);
        });
        return out.expect("the scope ends after its job");
    }
    job(&mut on_event)
}

/// Keeps the pool's threads running its tasks while one [`on_pool`] job runs, instead of
/// letting them fall asleep between the job's parallel loops: waking a sleeping thread costs a
/// system call and a scheduler wake-up per loop, during which the job's thread works alone.
///
/// Every pool thread gets one copy of [`stay_awake`] (`rayon::spawn_broadcast`, queued before
/// the job, so a thread always takes its copy before it can take one of the job's tasks: the
/// copy is the outer frame and the job's tasks run inside it, through `rayon::yield_now`). The
/// thread that takes the job usually does so inside its own copy; if it took the job first, its
/// copy returns at once when the job waits in a loop and runs it. The copies stop when this is
/// dropped. One job at a time has them: a copy that a thread picks up while it waits inside
/// other work holds that work up until the job ends, and copies of two jobs could each hold up
/// the other's job for good, so a second [`on_pool`] while one runs goes without.
#[cfg(feature = "flex")]
struct KeepAwake(std::sync::Arc<Spinning>);

/// What the copies of [`stay_awake`] read.
#[cfg(feature = "flex")]
#[derive(Default)]
struct Spinning {
    done: std::sync::atomic::AtomicBool,
    /// The job's thread, once the job has started.
    job_thread: std::sync::OnceLock<usize>,
}

/// Whether some [`on_pool`] job has the threads kept awake.
#[cfg(feature = "flex")]
static KEEPING_AWAKE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(feature = "flex")]
impl KeepAwake {
    /// `None` while another job has the threads.
    fn start() -> Option<Self> {
        use std::sync::atomic::Ordering;
        if KEEPING_AWAKE.swap(true, Ordering::AcqRel) {
            return None;
        }
        let spinning = std::sync::Arc::new(Spinning::default());
        let copies = spinning.clone();
        rayon::spawn_broadcast(move |ctx| stay_awake(ctx.index(), &copies));
        Some(Self(spinning))
    }

    /// Called on the job's thread when the job starts.
    fn job_started(&self) {
        let _ = self.0.job_thread.set(rayon::current_thread_index().expect("on the pool"));
    }
}

#[cfg(feature = "flex")]
impl Drop for KeepAwake {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        self.0.done.store(true, Ordering::Release);
        KEEPING_AWAKE.store(false, Ordering::Release);
    }
}

/// Runs the pool's tasks on thread `me` until the job is done; returns at once on the job's
/// thread (see [`KeepAwake`]), and on any thread once the job is done (a copy that a busy
/// thread takes late). After [`IDLE_BEFORE_NAP`] without a task it naps for [`NAP`] at a time:
/// a job that leaves the pool idle for long does not keep the cores busy, at the cost of a loop
/// that starts during a nap running without that thread for up to a nap.
#[cfg(feature = "flex")]
fn stay_awake(me: usize, spinning: &Spinning) {
    use std::sync::atomic::Ordering;
    let mut idle_since = std::time::Instant::now();
    while !spinning.done.load(Ordering::Acquire) && spinning.job_thread.get() != Some(&me) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = std::time::Instant::now(),
            _ if idle_since.elapsed() > IDLE_BEFORE_NAP => std::thread::sleep(NAP),
            _ => std::hint::spin_loop(),
        }
    }
}

/// How long [`stay_awake`] spins without a task before it naps, and for how long it naps.
#[cfg(feature = "flex")]
const IDLE_BEFORE_NAP: std::time::Duration = std::time::Duration::from_millis(2);
#[cfg(feature = "flex")]
const NAP: std::time::Duration = std::time::Duration::from_micros(200);

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

    /// The job's parallel loops run with the other threads kept awake and give the right sums,
    /// also with several jobs at once from several threads; a panic in the job comes out of
    /// `on_pool` and the next job runs (a hang fails this test).
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
