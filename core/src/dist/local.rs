//! What the replicas of one process share: the abort flag that stops every wait of the run once
//! one replica (or a peer process) fails, and "rounds" in which every local replica hands in a
//! value and the leader (local replica 0) turns them into one result for all.

use std::any::Any;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};

/// How often a blocked wait looks at the abort flag.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// The run's abort flag: the first reason given wins, and every wait of the run returns it.
#[derive(Default)]
pub(crate) struct Abort {
    reason: Mutex<Option<String>>,
    changed: Condvar,
}

impl Abort {
    /// Stops the run with `reason` (unless it was already stopped for another).
    pub fn raise(&self, reason: impl Into<String>) {
        let mut current = lock(&self.reason);
        if current.is_none() {
            *current = Some(reason.into());
        }
        self.changed.notify_all();
    }

    /// The reason the run was stopped, if it was.
    pub fn reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    /// `Err` with the reason once the run is stopped.
    pub fn check(&self) -> Result<()> {
        match self.reason() {
            Some(reason) => Err(Error::Distributed(reason)),
            None => Ok(()),
        }
    }

    /// Wakes waiters of [`Rounds`] (they share this condition).
    fn notify(&self) {
        self.changed.notify_all();
    }
}

/// Runs a blocking call (`what`, for the message if it panics) on a helper thread while this one
/// watches `abort`: returns the call's result, or the run's error once it is stopped (the helper
/// is then left to finish on its own). For calls with no timeout of their own: the collective
/// engine's, NCCL's joining.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn abortable<T: Send + 'static>(abort: &Abort, what: &str, call: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(call());
    });
    loop {
        match wait.recv_timeout(POLL) {
            Ok(result) => return result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => abort.check()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(Error::Distributed(format!("{what} panicked"))),
        }
    }
}

/// Locks a mutex, ignoring poisoning (a panicking replica raises the abort flag instead).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

type Output = std::result::Result<Arc<dyn Any + Send + Sync>, String>;

struct RoundState {
    /// Rounds completed.
    generation: u64,
    inputs: Vec<Option<Box<dyn Any + Send>>>,
    arrived: usize,
    output: Option<Output>,
}

/// Rounds between the `size` replicas of a process.
pub(crate) struct Rounds {
    size: usize,
    state: Mutex<RoundState>,
    changed: Condvar,
    abort: Arc<Abort>,
}

impl Rounds {
    pub fn new(size: usize, abort: Arc<Abort>) -> Self {
        let state = RoundState { generation: 0, inputs: (0..size).map(|_| None).collect(), arrived: 0, output: None };
        Self { size, state: Mutex::new(state), changed: Condvar::new(), abort }
    }

    /// Every local replica calls this with its `input`, in the same order of rounds. The leader
    /// (`local == 0`) gets all inputs (in local order) and computes the output with `lead`
    /// (outside the lock); everyone returns that output (an error of `lead` is everyone's).
    pub fn round<I, O>(&self, local: usize, input: I, lead: impl FnOnce(Vec<I>) -> Result<O>) -> Result<Arc<O>>
    where
        I: Send + 'static,
        O: Send + Sync + 'static,
    {
        self.abort.check()?;
        let mut state = lock(&self.state);
        let generation = state.generation;
        state.inputs[local] = Some(Box::new(input));
        state.arrived += 1;
        if state.arrived == self.size {
            self.changed.notify_all();
        }
        if local == 0 {
            while state.arrived < self.size {
                state = self.wait(state)?;
            }
            let inputs: Vec<I> = state.inputs.iter_mut().map(|i| *i.take().expect("every replica arrived").downcast::<I>().expect("one type per round")).collect();
            drop(state);
            let output: Output = lead(inputs).map(|o| Arc::new(o) as Arc<dyn Any + Send + Sync>).map_err(|e| e.to_string());
            let mut state = lock(&self.state);
            state.output = Some(output);
            state.arrived = 0;
            state.generation += 1;
            self.changed.notify_all();
            return take_output(&state);
        }
        while state.generation == generation {
            state = self.wait(state)?;
        }
        take_output(&state)
    }

    fn wait<'a>(&self, state: MutexGuard<'a, RoundState>) -> Result<MutexGuard<'a, RoundState>> {
        let (state, _) = self.changed.wait_timeout(state, POLL).unwrap_or_else(|e| e.into_inner());
        self.abort.check()?;
        Ok(state)
    }

    /// Wakes every waiter (after the abort flag was raised).
    pub fn wake(&self) {
        self.abort.notify();
        self.changed.notify_all();
    }
}

fn take_output<O: Send + Sync + 'static>(state: &RoundState) -> Result<Arc<O>> {
    match state.output.as_ref().expect("the leader published") {
        Ok(any) => Ok(any.clone().downcast::<O>().expect("one type per round")),
        Err(message) => Err(Error::Distributed(message.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_give_every_replica_the_leaders_result_in_order() {
        let abort = Arc::new(Abort::default());
        let rounds = Rounds::new(3, abort);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|local| {
                    let rounds = &rounds;
                    s.spawn(move || {
                        (0..50u64)
                            .map(|k| *rounds.round(local, k * 10 + local as u64, |all: Vec<u64>| Ok(all.iter().sum::<u64>())).unwrap())
                            .collect::<Vec<u64>>()
                    })
                })
                .collect();
            let expected: Vec<u64> = (0..50u64).map(|k| 30 * k + 3).collect();
            for handle in handles {
                assert_eq!(handle.join().unwrap(), expected);
            }
        });
    }

    #[test]
    fn an_abort_releases_waiting_replicas_with_its_reason() {
        let abort = Arc::new(Abort::default());
        let rounds = Rounds::new(2, abort.clone());
        std::thread::scope(|s| {
            let waiter = s.spawn(|| rounds.round(1, 0u8, |_| Ok(0u8)).map(|_| ()));
            std::thread::sleep(Duration::from_millis(50));
            abort.raise("replica 0 failed: boom");
            rounds.wake();
            let err = waiter.join().unwrap().unwrap_err();
            assert_eq!(err.to_string(), "replica 0 failed: boom");
        });
    }
}
