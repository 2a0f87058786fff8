//! Descriptors this process inherited from whoever started it, and how many it may open.
//!
//! A client, a terminal multiplexer or a test harness may start the server with open descriptors
//! beyond stdin, stdout and stderr, without close-on-exec. Left alone they would pass on to every
//! keeper, init and sandbox process (a sandbox holding a pipe or socket of the operator's). The
//! server and its internal subcommands therefore mark them close-on-exec first thing; descriptors
//! this program opens itself are close-on-exec already (the standard library and rustix open
//! them so), and the ones a child must have are given to it explicitly as its stdio.
//!
//! One of the crate's uses of `unsafe` (ARCHITECTURE.md lists them all, under "Invariants"):
//! neither the standard library nor rustix offers a safe way to name a descriptor by its number,
//! which is all `/proc/self/fd` gives.

#![allow(unsafe_code)]

use rustix::fs::{Mode, OFlags};
use rustix::io::FdFlags;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Raises this process's soft limit of open files to its hard limit. Call it first thing in
/// `main`: every process of this program may need more than the usual 1024. An HTTP connection
/// holds two descriptors; a keeper's exposed ports may relay 16 × 32 connections of two sockets
/// each besides its egress proxy's 64 (limits.rs), and a server or keeper out of descriptors stops
/// accepting until some are free. Sandbox processes inherit the raised soft limit, which gives
/// them nothing: any process may raise its own up to the hard limit.
pub fn raise_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let _ = setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum });
    }
}

/// Marks every descriptor above 2 close-on-exec. Call it first thing in `main`, while the process
/// is single-threaded and has opened nothing of its own.
pub fn close_inherited_on_exec() {
    let Ok(listing) = rustix::fs::open("/proc/self/fd", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) else {
        return;
    };
    let Ok(dir) = rustix::fs::Dir::read_from(&listing) else { return };
    let own = listing.as_raw_fd();
    let inherited: Vec<i32> =
        dir.flatten().filter_map(|entry| entry.file_name().to_str().ok()?.parse::<i32>().ok()).filter(|fd| *fd > 2 && *fd != own).collect();
    for fd in inherited {
        // SAFETY: `fd` was listed as open a moment ago and nothing of this single-threaded process
        // has closed it since (the listing's own descriptor, still open, is skipped); the borrow
        // lives for two fcntl calls only.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Ok(flags) = rustix::io::fcntl_getfd(borrowed) {
            let _ = rustix::io::fcntl_setfd(borrowed, flags | FdFlags::CLOEXEC);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inherited_descriptor_becomes_close_on_exec() {
        let (read, _write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::empty()).unwrap();
        assert!(!rustix::io::fcntl_getfd(&read).unwrap().contains(FdFlags::CLOEXEC));
        close_inherited_on_exec();
        assert!(rustix::io::fcntl_getfd(&read).unwrap().contains(FdFlags::CLOEXEC));
        assert!(!rustix::io::fcntl_getfd(std::io::stderr()).unwrap().contains(FdFlags::CLOEXEC), "stdio stays");
    }
}
