//! A persistent pool of worker threads for running a graph node by node.
//!
//! The calling thread is worker 0; `n - 1` workers are created once and live until the pool is
//! dropped. [`ThreadPool::run`] hands every worker the same job `f(ith)` and returns when all
//! have finished it. Inside a job the workers walk the node list together and separate dependent
//! nodes with [`ThreadPool::barrier`] — a sense-reversing counter on its own cache line that
//! spins (with `spin_loop`), then yields, so a barrier costs well under a microsecond when the
//! cores are free and does not starve another process when they are not. How long a thread
//! spins before it yields adapts (see [`wait_until`]): when the pool's threads outnumber the
//! cores they get, a waiter that spins keeps the thread it waits for off the core, and a fixed
//! long spin made a two-thread mat-vec on one core 60 times slower than on one thread. Idle
//! workers spin for a while after a job, then park until the next one. On Linux a worker that
//! starts a job on the CPU of another of the pool's threads moves itself to a free one (see
//! `unstack`).
//!
//! A panic inside a job is caught in the worker that raised it and returned by `run` as an
//! error; the pool stays usable. A job must not return early on one thread while others still
//! wait at a barrier: the executor keeps every thread walking every node and only skips the
//! work once a node has failed.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

/// Spins before a waiter starts yielding, at most (a thread's budget, see [`wait_until`]).
const SPIN_LIMIT: u32 = 1 << 14;
/// Spins before a waiter starts yielding, at least.
const SPIN_MIN: u32 = 1 << 6;
/// Yields before an idle worker parks.
const YIELD_LIMIT: u32 = 1 << 10;

thread_local! {
    /// This thread's spins before it yields in a wait (see [`wait_until`]).
    static SPIN_BUDGET: Cell<u32> = const { Cell::new(SPIN_LIMIT) };
}

#[repr(align(128))]
struct Padded<T>(T);

/// The job currently published to the workers: a type-erased `&dyn Fn(usize) + Sync`.
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize) + Sync));

// SAFETY: the pointer is only dereferenced while `run` keeps the closure it points to alive, and
// the closure itself is `Sync`, so calling it from several threads is allowed.
unsafe impl Send for JobPtr {}
// SAFETY: as above.
unsafe impl Sync for JobPtr {}

struct Shared {
    n_threads: usize,
    /// Incremented to publish a new job.
    epoch: Padded<AtomicUsize>,
    /// Workers that finished the current job.
    done: Padded<AtomicUsize>,
    job: Mutex<Option<JobPtr>>,
    stop: AtomicBool,
    /// The node barrier: arrivals and the generation (sense) they wait to change.
    arrived: Padded<AtomicUsize>,
    generation: Padded<AtomicUsize>,
    /// First panic message of the current job.
    panic: Mutex<Option<String>>,
    sleeping: Vec<AtomicBool>,
    /// The CPU each thread was last seen on ([`NO_CPU`] when unknown), see [`unstack`].
    cpus: Vec<Padded<AtomicUsize>>,
}

/// A [`Shared::cpus`] slot whose thread has not said where it runs.
const NO_CPU: usize = usize::MAX;

/// A fixed set of worker threads. See the module docs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` calls made from several caller threads.
    run_lock: Mutex<()>,
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all (the caller counts as one; at least 1).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads: n,
            epoch: Padded(AtomicUsize::new(0)),
            done: Padded(AtomicUsize::new(0)),
            job: Mutex::new(None),
            stop: AtomicBool::new(false),
            arrived: Padded(AtomicUsize::new(0)),
            generation: Padded(AtomicUsize::new(0)),
            panic: Mutex::new(None),
            sleeping: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cpus: (0..n).map(|_| Padded(AtomicUsize::new(NO_CPU))).collect(),
        });
        let workers = (1..n)
            .map(|ith| {
                let sh = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("tessera-cpu-{ith}"))
                    .spawn(move || worker(sh, ith))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads in the pool, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(ith)` on every thread (`ith` in `0..n_threads`, the caller is 0) and returns when
    /// all are done. A panic in any thread comes back as `Err(message)`.
    pub fn run<F: Fn(usize) + Sync>(&self, f: F) -> Result<(), String> {
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if sh.n_threads == 1 {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(0))) {
                return Err(panic_message(&*p));
            }
            return Ok(());
        }
        let dyn_f: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: the lifetime is erased only for the duration of this call: we wait below until
        // every worker has finished with the job and then clear it, so no worker can use the
        // pointer after `f` is dropped.
        let erased: JobPtr = JobPtr(unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(dyn_f)
        });
        *sh.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(erased);
        sh.cpus[0]
            .0
            .store(placement::current_cpu(), Ordering::Relaxed);
        sh.done.0.store(0, Ordering::Relaxed);
        sh.epoch.0.fetch_add(1, Ordering::SeqCst);
        for (ith, w) in self.workers.iter().enumerate() {
            if sh.sleeping[ith + 1].load(Ordering::SeqCst) {
                w.thread().unpark();
            }
        }
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(0))) {
            record_panic(sh, &*p);
        }
        wait_until(|| sh.done.0.load(Ordering::Acquire) >= sh.n_threads - 1);
        *sh.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        match sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(msg) => Err(msg),
            None => Ok(()),
        }
    }

    /// Waits until every thread of the current job has arrived here.
    pub fn barrier(&self) {
        let sh = &*self.shared;
        if sh.n_threads == 1 {
            return;
        }
        let gen = sh.generation.0.load(Ordering::Acquire);
        if sh.arrived.0.fetch_add(1, Ordering::AcqRel) + 1 == sh.n_threads {
            sh.arrived.0.store(0, Ordering::Relaxed);
            sh.generation.0.fetch_add(1, Ordering::Release);
        } else {
            wait_until(|| sh.generation.0.load(Ordering::Acquire) != gen);
        }
    }
}

fn record_panic(sh: &Shared, p: &(dyn Any + Send)) {
    let mut slot = sh.panic.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        *slot = Some(panic_message(p));
    }
}

/// Waits inside a job (at a barrier, or for the workers to finish) until `done()`: spins up to
/// this thread's budget, then yields. A wait that outlasts the budget halves it (down to
/// [`SPIN_MIN`]), one that ends while spinning doubles it (up to [`SPIN_LIMIT`]). With a core
/// for every thread, waits end while spinning and the budget stays at the limit; when two of
/// the pool's threads share a core, the one that waits must give the core up for the other to
/// arrive, so its waits outlast the budget and it soon yields after a few dozen spins instead
/// of 16 384.
#[inline]
fn wait_until(done: impl Fn() -> bool) {
    if done() {
        return;
    }
    let budget = SPIN_BUDGET.get();
    let mut spins = 0u32;
    while !done() {
        if spins < budget {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
        spins = spins.saturating_add(1);
    }
    SPIN_BUDGET.set(next_budget(budget, spins));
}

/// The spin budget after a wait of `spins` (spins and yields) with `budget`: see
/// [`wait_until`].
fn next_budget(budget: u32, spins: u32) -> u32 {
    if spins > budget {
        (budget / 2).max(SPIN_MIN)
    } else {
        budget.saturating_mul(2).min(SPIN_LIMIT)
    }
}

fn worker(sh: Arc<Shared>, ith: usize) {
    let mut seen = 0usize;
    loop {
        // wait for a new job: spin (this thread's budget), then yield, then park
        let budget = SPIN_BUDGET.get();
        let mut spins = 0u32;
        loop {
            if sh.stop.load(Ordering::Acquire) {
                return;
            }
            let e = sh.epoch.0.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if spins < budget {
                std::hint::spin_loop();
                spins += 1;
            } else if spins < budget + YIELD_LIMIT {
                thread::yield_now();
                spins += 1;
            } else {
                // SeqCst on both sides (here and in `run`) so that either the publisher sees the
                // flag and unparks, or this re-check sees the new epoch
                sh.sleeping[ith].store(true, Ordering::SeqCst);
                if sh.epoch.0.load(Ordering::SeqCst) == seen && !sh.stop.load(Ordering::Acquire) {
                    thread::park_timeout(std::time::Duration::from_millis(50));
                }
                sh.sleeping[ith].store(false, Ordering::Release);
            }
        }
        let job = *sh.job.lock().unwrap_or_else(|e| e.into_inner());
        unstack(&sh, ith);
        if let Some(JobPtr(f)) = job {
            // SAFETY: `run` published this pointer and keeps the closure alive until `done`
            // reaches n - 1, which happens only after this call returns.
            let f = unsafe { &*f };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(ith))) {
                record_panic(&sh, &*p);
            }
        }
        sh.done.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// Worker `ith`, about to run a job, moves itself off a CPU where another of the pool's threads
/// was last seen, onto one of its allowed CPUs where none was, if there is one.
///
/// Linux sometimes wakes a parked worker on the CPU of the thread that woke it (seen on a
/// two-vCPU VM: both pool threads on one vCPU, the other idle), and the two then keep that CPU
/// busy in turns, each ever "cache hot", so the load balancer leaves them stacked for hundreds
/// of milliseconds: a two-thread mat-vec ran at a third of its speed. The move pins the thread
/// to the free CPU for the moment of the move and then gives it back its whole affinity mask,
/// so the kernel stays free to place it later; with more threads than CPUs there is no free CPU
/// and nothing moves. At most one move per thread every [`HOP_INTERVAL`].
fn unstack(sh: &Shared, ith: usize) {
    let me = placement::current_cpu();
    sh.cpus[ith].0.store(me, Ordering::Relaxed);
    if me == NO_CPU {
        return;
    }
    let taken = |cpu: usize| {
        sh.cpus
            .iter()
            .enumerate()
            .any(|(j, c)| j != ith && c.0.load(Ordering::Relaxed) == cpu)
    };
    if !taken(me) {
        return;
    }
    let now = std::time::Instant::now();
    if LAST_HOP
        .get()
        .is_some_and(|t| now.duration_since(t) < HOP_INTERVAL)
    {
        return;
    }
    LAST_HOP.set(Some(now));
    if let Some(cpu) = placement::hop(|cpu| !taken(cpu)) {
        sh.cpus[ith].0.store(cpu, Ordering::Relaxed);
    }
}

/// The shortest time between two moves of one thread by [`unstack`].
const HOP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(2);

thread_local! {
    /// When this thread last moved itself (see [`unstack`]).
    static LAST_HOP: Cell<Option<std::time::Instant>> = const { Cell::new(None) };
}

/// Where a thread runs, and moving it: Linux only; elsewhere nothing is known and nothing moves.
#[cfg(target_os = "linux")]
mod placement {
    use super::NO_CPU;

    /// The CPU the calling thread runs on, or [`NO_CPU`].
    pub fn current_cpu() -> usize {
        // SAFETY: `sched_getcpu` takes no arguments and only reads the thread's CPU number.
        let c = unsafe { libc::sched_getcpu() };
        usize::try_from(c).unwrap_or(NO_CPU)
    }

    /// Moves the calling thread to the first CPU of its affinity mask that `free` accepts, then
    /// restores the mask; returns that CPU, or `None` when no CPU qualified or a call failed.
    pub fn hop(free: impl Fn(usize) -> bool) -> Option<usize> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: an all-zero `cpu_set_t` is an empty set (a plain bit array).
        let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `mask` is a valid, writable `cpu_set_t` of `size` bytes; pid 0 is this thread.
        if unsafe { libc::sched_getaffinity(0, size, &mut mask) } != 0 {
            return None;
        }
        let n_bits = 8 * size;
        // SAFETY: `CPU_ISSET` reads bit `c` of `mask`, `c < n_bits`.
        let cpu = (0..n_bits).find(|&c| unsafe { libc::CPU_ISSET(c, &mask) } && free(c))?;
        // SAFETY: as above, zeroed is the empty set.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu < n_bits`, inside the set.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        // SAFETY: both sets are valid `cpu_set_t`s of `size` bytes; pid 0 is this thread. The
        // first call moves the thread to `cpu` before it returns, the second gives back the
        // mask it had.
        let moved = unsafe { libc::sched_setaffinity(0, size, &one) } == 0;
        // SAFETY: as above.
        let restored = unsafe { libc::sched_setaffinity(0, size, &mask) } == 0;
        debug_assert!(restored, "restoring a thread's own affinity mask failed");
        moved.then_some(cpu)
    }
}

#[cfg(not(target_os = "linux"))]
mod placement {
    use super::NO_CPU;

    pub fn current_cpu() -> usize {
        NO_CPU
    }

    pub fn hop(_free: impl Fn(usize) -> bool) -> Option<usize> {
        None
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_thread_runs_the_job_once() {
        for n in [1, 2, 3, 4] {
            let pool = ThreadPool::new(n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..100 {
                pool.run(|ith| {
                    hits[ith].fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 100);
            }
        }
    }

    /// One job of `phases` phases on `pool`: each thread writes the phase, and after a barrier
    /// every thread must see every thread's write.
    fn check_phases(pool: &ThreadPool, phases: u64) {
        let n = pool.n_threads();
        let data: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        pool.run(|ith| {
            for phase in 1..=phases {
                data[ith].store(phase, Ordering::Relaxed);
                pool.barrier();
                for d in &data {
                    assert_eq!(d.load(Ordering::Relaxed), phase);
                }
                pool.barrier();
            }
        })
        .unwrap();
    }

    #[test]
    fn barriers_order_phases() {
        check_phases(&ThreadPool::new(3), 200);
    }

    #[test]
    fn the_spin_budget_shrinks_after_long_waits_and_grows_back() {
        // waits that outlast the budget (the thread waited for shares this core) halve it down
        // to the floor ...
        let mut b = SPIN_LIMIT;
        let mut seen = vec![b];
        while b > SPIN_MIN {
            b = next_budget(b, b + 1);
            seen.push(b);
        }
        assert_eq!(seen.len(), 9, "{seen:?}");
        assert_eq!(next_budget(SPIN_MIN, u32::MAX), SPIN_MIN);
        // ... waits that end while spinning double it up to the limit
        assert_eq!(next_budget(SPIN_MIN, 1), 2 * SPIN_MIN);
        assert_eq!(next_budget(SPIN_MIN, SPIN_MIN), 2 * SPIN_MIN);
        assert_eq!(next_budget(SPIN_LIMIT, 3), SPIN_LIMIT);
    }

    #[test]
    fn barriers_hold_with_more_threads_than_cores() {
        // more threads than the machine has cores: waiters must yield for the others to
        // arrive; every phase still sees every thread's write
        let n = thread::available_parallelism().map_or(2, |c| c.get()) + 3;
        let pool = ThreadPool::new(n);
        for _ in 0..3 {
            check_phases(&pool, 100);
        }
    }

    #[test]
    fn a_panic_is_reported_and_the_pool_stays_usable() {
        let pool = ThreadPool::new(2);
        let err = pool
            .run(|ith| {
                if ith == 1 {
                    panic!("kernel exploded on thread {ith}");
                }
            })
            .unwrap_err();
        assert!(err.contains("kernel exploded on thread 1"), "{err}");
        let count = AtomicUsize::new(0);
        pool.run(|_| {
            count.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn runs_from_several_caller_threads_in_turn() {
        let pool = Arc::new(ThreadPool::new(2));
        let total = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let (pool, total) = (Arc::clone(&pool), Arc::clone(&total));
                thread::spawn(move || {
                    for _ in 0..50 {
                        pool.run(|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 4 * 50 * 2);
    }

    /// The CPUs this thread may run on, in order.
    #[cfg(target_os = "linux")]
    fn allowed_cpus() -> Vec<usize> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: zeroed is the empty set.
        let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `mask` is a valid, writable set of `size` bytes; pid 0 is this thread.
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut mask) }, 0);
        (0..8 * size)
            // SAFETY: `c` is inside the set.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &mask) })
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_hop_moves_the_thread_and_gives_back_its_mask() {
        thread::spawn(|| {
            let before = allowed_cpus();
            assert_eq!(placement::hop(|_| false), None);
            assert_eq!(allowed_cpus(), before);
            // to every other allowed CPU in turn (none on a one-CPU machine: no move)
            let mut seen_there = 0;
            for _ in 0..2 * before.len() {
                let here = placement::current_cpu();
                assert!(before.contains(&here), "{here} not in {before:?}");
                let there = placement::hop(|c| c != here);
                assert_eq!(allowed_cpus(), before, "the mask was not restored");
                match there {
                    Some(cpu) => {
                        // the kernel may move the thread again at once, but not every time
                        seen_there += usize::from(placement::current_cpu() == cpu);
                        assert_ne!(cpu, here);
                        assert!(before.contains(&cpu));
                    }
                    None => assert_eq!(before, vec![here]),
                }
            }
            assert!(
                before.len() == 1 || seen_there > 0,
                "never ran where it hopped"
            );
        })
        .join()
        .unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_on_another_threads_cpu_moves_to_a_free_one() {
        thread::spawn(|| {
            let allowed = allowed_cpus();
            let pool = ThreadPool::new(2);
            let sh = &*pool.shared;
            let here = placement::current_cpu();
            // this thread plays worker 1 and finds thread 0 on its own CPU
            sh.cpus[0].0.store(here, Ordering::Relaxed);
            unstack(sh, 1);
            let moved_to = sh.cpus[1].0.load(Ordering::Relaxed);
            if allowed.len() > 1 {
                assert_ne!(moved_to, here, "stayed on thread 0's CPU {here}");
                assert!(allowed.contains(&moved_to));
            } else {
                assert_eq!(moved_to, here);
            }
            // not stacked: no move, the slot says where it runs
            sh.cpus[0].0.store(NO_CPU, Ordering::Relaxed);
            unstack(sh, 1);
            assert!(allowed.contains(&sh.cpus[1].0.load(Ordering::Relaxed)));
            // every allowed CPU taken by another thread: nowhere to go
            let crowded = ThreadPool::new(allowed.len() + 1);
            let csh = &*crowded.shared;
            for (j, &c) in allowed.iter().enumerate() {
                csh.cpus[j].0.store(c, Ordering::Relaxed);
            }
            let me = allowed.len();
            LAST_HOP.set(None);
            unstack(csh, me);
            let stayed = csh.cpus[me].0.load(Ordering::Relaxed);
            assert!(allowed.contains(&stayed));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn idle_workers_wake_up_after_parking() {
        let pool = ThreadPool::new(2);
        pool.run(|_| {}).unwrap();
        thread::sleep(std::time::Duration::from_millis(120));
        let count = AtomicUsize::new(0);
        pool.run(|_| {
            count.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
