//! Where the computation runs. Burn's flex backend, its GEMM and our kernels split work over
//! rayon's pool, one worker per core. Driven from the main thread, a step keeps three threads
//! busy on two cores: the main thread running the single-threaded ops, and the workers spinning
//! (`sched_yield`) between parallel sections, preempting it. Run from inside a pool instead, the
//! caller is itself a worker: its parallel sections split across it and the other workers, and no
//! thread outnumbers the cores.

/// Runs `f` on a worker of a rayon pool with one thread per core (the `RAYON_NUM_THREADS`
/// environment variable overrides the count); on the calling thread if the pool cannot be built.
pub fn on_compute_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match rayon::ThreadPoolBuilder::new().thread_name(|i| format!("variorum-compute-{i}")).build() {
        Ok(pool) => pool.install(f),
        Err(_) => f(),
    }
}
