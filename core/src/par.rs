//! Work spread over the machine's cores with scoped threads, results in input order, so what
//! is computed does not depend on how many threads computed it. (Plain `std`: kiln-core's
//! model-only build has no thread pool; on a target without threads it runs inline.)

use std::num::NonZeroUsize;

/// Threads to use: the cores this process may run on (cgroup and affinity aware), at least 1.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
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
    fn keeps_the_order_of_the_items() {
        let items: Vec<u64> = (0..10_007).collect();
        let squares = map_in_order(&items, |x| x * x);
        assert_eq!(squares, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert_eq!(map_in_order(&[] as &[u64], |x| *x), Vec::<u64>::new());
        assert_eq!(map_in_order(&[3u64], |x| x + 1), vec![4]);
    }
}
