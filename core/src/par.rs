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
/// 100M decode went from about 480 context switches a step to 140. Inline where already on the
/// pool, and without the `flex` feature (no pool). The job runs on another thread: keep
/// thread-bound state (a GPU backend's stream, `kiln_backends::device::guard`) out of it. If
/// `on_event` panics, the panic comes out after the job has ended (its later events dropped).
pub fn on_pool<R: Send, E: Send>(job: impl FnOnce(&mut dyn FnMut(E)) -> R + Send, mut on_event: impl FnMut(E)) -> R {
    #[cfg(feature = "flex")]
    if rayon::current_thread_index().is_none() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut out = None;
        rayon::in_place_scope(|s| {
            let out = &mut out;
            s.spawn(move |_| {
                *out = Some(job(&mut |e| {
                    let _ = tx.send(e);
                }))
            });
            rx.into_iter().for_each(&mut on_event);
        });
        return out.expect("the scope ends after its job");
    }
    job(&mut on_event)
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

    #[test]
    fn keeps_the_order_of_the_items() {
        let items: Vec<u64> = (0..10_007).collect();
        let squares = map_in_order(&items, |x| x * x);
        assert_eq!(squares, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(map_in_order(&[] as &[u64], |x| *x), Vec::<u64>::new());
        assert_eq!(map_in_order(&[3u64], |x| x + 1), vec![4]);
    }
}
