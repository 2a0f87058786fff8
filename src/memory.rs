//! Giving freed heap memory back to the system after a large request.
//!
//! A parsed request of many small JSON values is thousands of small allocations; freed, they stay
//! in the allocator's heaps (glibc keeps freed memory in each thread's arena for reuse), so a
//! server that parsed one large message keeps its peak resident size for the rest of its life.
//! After such a request the HTTP listener asks glibc to return what is free ([`release_free`]).
//!
//! One of the crate's three uses of `unsafe` (with `descriptors` and the Landlock tier):
//! `malloc_trim` has no safe wrapper. It takes no pointer and only walks the allocator's own
//! free lists under their locks, so calling it is sound at any time from any thread.

#![allow(unsafe_code)]

/// A request whose parsed cost reaches this many bytes is followed by [`release_free`].
pub const RELEASE_AFTER_BYTES: usize = 8 << 20;

/// Returns the heap's free memory to the system (glibc), or does nothing (other C libraries).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and touches only the allocator's own free memory,
    // under the allocator's locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
