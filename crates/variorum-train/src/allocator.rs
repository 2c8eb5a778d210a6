//! The allocator setting of every process that trains: freed pages stay with the process.
//!
//! A training step frees and reallocates the same large activation buffers; mimalloc (the
//! binary's global allocator) hands freed pages back to the kernel after 1 s by default, and
//! the kernel zeroes every page it hands out again: 36 % of a small-GPT step was
//! `clear_page_erms` (478 -> 732 tokens/s without it, peak RSS 5.3 -> 6.7 GiB; docs/cpu-speed.md).

/// mimalloc's `purge_delay`: position 15 of `mi_option_e` in the mimalloc 3 header that
/// libmimalloc-sys 0.1.49 builds (its Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Never purge freed memory. Call once at start, before other threads exist; harmless when
/// mimalloc is not the global allocator.
pub fn keep_freed_pages() {
    // SAFETY: sets a process-wide allocator option; mimalloc's options are plain integers.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// Hand freed memory back at once: a benchmark measuring what a computation's tensors need at
/// their peak, without the pages an allocator keeps for reuse (a process of its own). Call once
/// at start, before other threads exist, instead of [`keep_freed_pages`]; harmless when mimalloc
/// is not the global allocator.
pub fn return_freed_pages() {
    // SAFETY: as above.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tripwire for a mimalloc upgrade that renumbers its options: position 15 must still hold
    /// purge_delay's default (1000 ms in mimalloc 3's options.c; its header still says 10) and
    /// take the setting.
    #[test]
    fn option_15_is_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, 1000);
        }
        keep_freed_pages();
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
    }
}
