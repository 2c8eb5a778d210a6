//! Where the computation runs. Burn's flex backend, its GEMM and our kernels split work over
//! rayon's global pool, one worker per core. Driven from a thread outside the pool, a step keeps
//! three threads busy on two cores: the driving thread running the single-threaded ops, and the
//! workers spinning (`sched_yield`) between parallel sections, preempting it. Made worker 0 of
//! the pool instead, the driving thread takes its share of every parallel section and no thread
//! outnumbers the cores (baby GPT 13,926 → 15,786 tokens/s, docs/cpu-speed.md).

/// Makes the calling thread worker 0 of rayon's global pool (one thread per core;
/// `RAYON_NUM_THREADS` overrides the count). Call it first, before anything uses rayon; if the
/// pool already exists it does nothing.
pub fn join_compute_pool() {
    let _ = rayon::ThreadPoolBuilder::new().use_current_thread().build_global();
}
