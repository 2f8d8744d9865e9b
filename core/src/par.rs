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
/// pool's other threads stay awake ([`stay_awake`]) rather than sleep between its loops: the
/// same benchmark's context switches fell from 48k to 13k a run, decoding 337 to 361 tokens/s
/// (five alternating runs each, Intel Xeon, 2 cores). Inline where already on the
/// pool, and without the `flex` feature (no pool). The job runs on another thread: keep
/// thread-bound state (a GPU backend's stream, `kiln_backends::device::guard`) out of it. If
/// `on_event` panics, the panic comes out after the job has ended (its later events dropped).
pub fn on_pool<R: Send, E: Send>(job: impl FnOnce(&mut dyn FnMut(E)) -> R + Send, mut on_event: impl FnMut(E)) -> R {
    #[cfg(feature = "flex")]
    if rayon::current_thread_index().is_none() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let (tx, rx) = std::sync::mpsc::channel();
        let mut out = None;
        let done = AtomicBool::new(false);
        let job_thread = AtomicUsize::new(usize::MAX);
        rayon::in_place_scope(|s| {
            let (out, done, job_thread) = (&mut out, &done, &job_thread);
            s.spawn(move |_| {
                // Set however the job ends: a panic must not leave the other threads spinning.
                let _done = SetOnDrop(done);
                job_thread.store(rayon::current_thread_index().expect("on the pool"), Ordering::SeqCst);
                *out = Some(job(&mut |e| {
                    let _ = tx.send(e);
                }));
            });
            s.spawn_broadcast(move |_, ctx| stay_awake(ctx.index(), job_thread, done));
            rx.into_iter().for_each(&mut on_event);
        });
        return out.expect("the scope ends after its job");
    }
    job(&mut on_event)
}

/// Sets its flag when dropped.
#[cfg(feature = "flex")]
struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

#[cfg(feature = "flex")]
impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Keeps pool thread `me` running the pool's tasks until `done`, instead of letting it fall
/// asleep between the job's parallel loops: waking a sleeping thread costs a system call and a
/// scheduler wake-up per loop, during which the job's thread works alone. After
/// [`IDLE_BEFORE_NAP`] without a task it naps briefly, so a job that stops using the pool for a
/// while does not keep the other cores spinning. Returns at once on the job's own thread (which
/// runs this when it waits inside one of its loops; it would otherwise never get back to the job).
#[cfg(feature = "flex")]
fn stay_awake(me: usize, job_thread: &std::sync::atomic::AtomicUsize, done: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    let mut idle_since = std::time::Instant::now();
    while !done.load(Ordering::SeqCst) && job_thread.load(Ordering::SeqCst) != me {
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

    /// The job's parallel loops run with the other threads kept awake and give the right sums;
    /// a panic in the job comes out of `on_pool` instead of leaving the others spinning (this
    /// test would hang).
    #[test]
    #[cfg(feature = "flex")]
    fn a_job_with_parallel_loops_ends_and_its_panic_comes_out() {
        use rayon::prelude::*;
        for _ in 0..20 {
            let sum: u64 = on_pool(|_| (0..200u64).map(|i| (0..1000u64).into_par_iter().map(|j| i * j).sum::<u64>()).sum(), |_: ()| {});
            assert_eq!(sum, (0..200u64).sum::<u64>() * 499_500);
        }
        let panicked = std::panic::catch_unwind(|| on_pool(|_| (0..1000u64).into_par_iter().map(|i| assert!(i < 999, "the job's panic")).count(), |_: ()| {}));
        assert!(panicked.is_err());
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
