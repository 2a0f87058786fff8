//! Giving freed heap memory back to the system after a large request.
//!
//! A parsed request of many small JSON values is thousands of small allocations; freed, they stay
//! in the allocator's heaps (glibc keeps freed memory in each thread's arena for reuse), so a
//! server that parsed one large message keeps its peak resident size for the rest of its life.
//! After such a request, and after writing a large answer (a command's whole output, escaped
//! twice: in the structured result and in its text), the transports ask glibc to return what is
//! free ([`release_free`]).
//!
//! One of the crate's uses of `unsafe` (ARCHITECTURE.md lists them): `malloc_trim` and
//! `mallopt` have no safe wrapper. They take no pointer and only touch the allocator's own
//! state under its locks, so calling them is sound at any time from any thread.

#![allow(unsafe_code)]

/// A request whose parsed cost, or an answer whose bytes, reach this many bytes is followed by
/// [`release_free`].
pub const RELEASE_AFTER_BYTES: usize = 8 << 20;

/// Allocations of this size and larger are mapped on their own and unmapped when freed.
pub const MAP_FROM_BYTES: usize = 128 * 1024;

/// Fixes glibc's mapping threshold at [`MAP_FROM_BYTES`] (its default starting value), for the
/// server's life. glibc otherwise raises it to the size of every large mapped block freed (up to
/// 32 MiB) and its heap-trimming threshold to twice that: after one large answer, blocks of
/// megabytes come from the per-thread heaps, whose top is then kept rather than trimmed, and
/// [`release_free`] cannot return it (a review saw 178 MiB kept after eight 27 MB answers). Does
/// nothing with other C libraries.
pub fn fix_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes the allocator's parameters, under its
    // own lock; any thread may call it at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MAP_FROM_BYTES as libc::c_int);
    }
}

/// Returns the heap's free memory to the system (glibc), or does nothing (other C libraries).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and touches only the allocator's own free memory,
    // under the allocator's locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
