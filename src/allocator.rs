//! The addon's own allocator on x86-64 Linux (glibc): jemalloc, tuned to give memory back.
//!
//! A burst of starts (1,000 commands at once) allocates and frees about 40 KB a command in
//! requests, TLS records and the creation phase, on the runtime's worker threads, while each
//! command keeps about 10 KB for its follow. In glibc's per-thread arenas the survivors end
//! up scattered among the freed chunks, and `malloc_trim` can give back only whole free
//! pages: 1,000 commands over HTTP/2 stayed at 27–31 KB of resident memory each, of which
//! about 12 KB were free chunks glibc kept. jemalloc sorts allocations into slabs by size,
//! so what a burst freed comes back as whole slabs; with the settings below (one arena, no
//! per-thread caches, freed pages given back within a second by jemalloc's background
//! thread) the same run holds 18 KB a command, and 10,000 started in waves 14 KB (was 18;
//! docs/benchmarks.md §14), while the 256 MiB throughput and the warm echo stay as they
//! were (§1, §4).
//!
//! What a burst still leaves behind is slabs a survivor keeps: a slab is freed only once its
//! last region is, and by default jemalloc cuts slabs of several pages for many small size
//! classes (five pages of 640-byte regions, seven of 448). After 1,000 starts over HTTP/2,
//! jemalloc's own statistics showed 3.5 MB of small allocations held in 8.4 MB of slabs.
//! `slab_sizes:1-2048:1` cuts one-page slabs for every class up to 2 KiB, so a survivor
//! keeps one page, not five: 1,000 in flight over HTTP/2 went from 17.0 to 15.5 KB a command
//! (median of three runs each). Classes above 2 KiB keep jemalloc's choice, where a page
//! would hold one region and waste up to a third of it.
//!
//! Only the addon's Rust allocations go through it (prefixed symbols): Node, V8 and libuv
//! keep glibc's malloc, which [`crate::trim`] still trims. A host can override the settings
//! with `_RJEM_MALLOC_CONF`.
//!
//! Not on arm64: jemalloc's page size is fixed when it is built, and arm64 kernels run 4, 16
//! or 64 KiB pages; until the arm64 build is measured on each, it keeps the system allocator.
//! Nor on musl, macOS or Windows (not measured either).

#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its settings from this symbol at its first allocation.
#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] =
    b"background_thread:true,narenas:1,tcache:false,dirty_decay_ms:1000,muzzy_decay_ms:0,slab_sizes:1-2048:1\0";
