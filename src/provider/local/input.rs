//! The writer of a task's input channel (`provider::input_channel`), from the server, into a
//! task directory that the sandbox controls.
//!
//! Everything in that directory is hostile: the sandbox can replace the FIFO with a regular
//! file, a symbolic link, a directory, or a FIFO nobody reads, and it can leave the task's input
//! full. So each file is opened relative to the already-opened task directory with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, `O_NOFOLLOW`), write-only
//! and non-blocking (a FIFO without a reader fails at once with `ENXIO` instead of waiting), its
//! type is checked on the open descriptor (a FIFO, nothing else), and the bytes are written
//! non-blocking, waiting for room with `poll` until the deadline: a task that never reads costs
//! one call at most that long, and the error says how much went in.

use crate::provider::{input_channel, InputError, ProviderError};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{fstat, openat2, statat, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

/// How a task directory's files are resolved: beneath it, no symbolic link anywhere.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// Opens a task directory `task_dir` (relative) beneath `base` (the sandbox user's home, opened
/// by the caller) without following any symbolic link.
pub fn open_task_dir(base: impl AsFd, task_dir: &str) -> Result<OwnedFd, InputError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    match openat2(base, task_dir, flags, Mode::empty(), RESOLVE) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT) => Err(InputError::Missing),
        Err(Errno::LOOP) | Err(Errno::NOTDIR) | Err(Errno::XDEV) => {
            Err(InputError::Tampered("the task directory is not a plain directory (a symbolic link or a file)".into()))
        }
        Err(e) => Err(InputError::Provider(ProviderError::Unavailable(format!("cannot open the task directory: {e}")))),
    }
}

/// Writes `data` to the channel in task directory `dir`, then closes the input when `eof`. An
/// error before the data went in means none of it did; once it went in, a failure to close the
/// input is [`InputError::EndNotSent`].
pub fn write(dir: &OwnedFd, data: &[u8], eof: bool, deadline: Instant) -> Result<(), InputError> {
    if statat(dir, input_channel::CLOSED, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return Err(InputError::Closed);
    }
    let with_data = !data.is_empty() || !eof;
    if with_data {
        let fifo = open_fifo(dir, input_channel::FIFO)?;
        if eof {
            // The end-of-input FIFO replaced by the sandbox fails the call before any byte goes
            // in (found by a review: the data went in and the answer said nothing had).
            check_fifo(dir, input_channel::EOF)?;
        }
        write_all(&fifo, data, deadline)?;
    }
    if eof {
        // Opening and closing the end-of-input FIFO lets the holder go (see the supervisor's
        // "Input"); without a reader there, the holder is already gone.
        match (open_fifo(dir, input_channel::EOF), with_data) {
            (Ok(_), _) => {}
            (Err(InputError::NoReader), false) => return Err(InputError::Closed),
            (Err(e), false) => return Err(e),
            (Err(InputError::NoReader), true) => return Err(InputError::EndNotSent("the input was closed meanwhile".into())),
            (Err(InputError::Tampered(what)), true) => return Err(InputError::EndNotSent(what)),
            (Err(_), true) => return Err(InputError::EndNotSent("the end-of-input FIFO could not be opened".into())),
        }
    }
    Ok(())
}

/// Checks, without opening it, that `name` of `dir` is a FIFO and no link.
fn check_fifo(dir: &OwnedFd, name: &str) -> Result<(), InputError> {
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => must_be_fifo(name, FileType::from_raw_mode(st.st_mode)),
        Err(Errno::NOENT) => Err(InputError::Missing),
        Err(e) => Err(InputError::Provider(ProviderError::Unavailable(format!("cannot check the task's input: {e}")))),
    }
}

/// Opens FIFO `name` of `dir` for writing without blocking, following no link, and checks that
/// it is a FIFO.
fn open_fifo(dir: &OwnedFd, name: &str) -> Result<OwnedFd, InputError> {
    let flags = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let fd = match openat2(dir, name, flags, Mode::empty(), RESOLVE) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(InputError::Missing),
        Err(Errno::NXIO) => return Err(InputError::NoReader),
        Err(Errno::LOOP) => return Err(tampered(name, "a symbolic link")),
        Err(Errno::ISDIR) => return Err(tampered(name, "a directory")),
        Err(Errno::ACCESS) | Err(Errno::PERM) | Err(Errno::ROFS) => return Err(tampered(name, "not writable")),
        Err(e) => return Err(InputError::Provider(ProviderError::Unavailable(format!("cannot open the task's input: {e}")))),
    };
    let kind = fstat(&fd).map_err(|e| InputError::Provider(ProviderError::Unavailable(format!("cannot check the task's input: {e}"))))?;
    must_be_fifo(name, FileType::from_raw_mode(kind.st_mode)).map(|()| fd)
}

/// Refuses a channel file `name` of type `kind` that is not a FIFO, saying what it is.
fn must_be_fifo(name: &str, kind: FileType) -> Result<(), InputError> {
    match kind {
        FileType::Fifo => Ok(()),
        FileType::Symlink => Err(tampered(name, "a symbolic link")),
        FileType::RegularFile => Err(tampered(name, "a regular file")),
        FileType::Directory => Err(tampered(name, "a directory")),
        _ => Err(tampered(name, "not a FIFO")),
    }
}

fn tampered(name: &str, what: &str) -> InputError {
    InputError::Tampered(format!("the task's input channel {name:?} is {what}, not the FIFO the supervisor made"))
}

/// Writes all of `data` to the non-blocking `fd`, waiting for room until `deadline`.
fn write_all(fd: &OwnedFd, data: &[u8], deadline: Instant) -> Result<(), InputError> {
    let mut written = 0;
    while written < data.len() {
        match rustix::io::write(fd, &data[written..]) {
            Ok(n) => written += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(InputError::Full { written: Some(written) });
                }
                let mut fds = [PollFd::new(fd, PollFlags::OUT)];
                let wait = rustix::event::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
                match poll(&mut fds, Some(&wait)) {
                    Ok(0) => return Err(InputError::Full { written: Some(written) }),
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(InputError::Provider(ProviderError::Unavailable(format!("waiting for the task's input: {e}")))),
                }
            }
            Err(Errno::PIPE) => return Err(InputError::NoReader),
            Err(e) => return Err(InputError::Provider(ProviderError::Unavailable(format!("writing the task's input: {e}")))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Duration;

    fn dir(tag: &str) -> (std::path::PathBuf, OwnedFd) {
        let path = std::env::temp_dir().join(format!("smcp-input-{tag}-{}", crate::ids::random_hex(4)));
        std::fs::create_dir_all(path.join("t")).unwrap();
        let base = rustix::fs::open(&path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let fd = open_task_dir(&base, "t").unwrap();
        (path, fd)
    }

    fn mkfifo(path: &std::path::Path) {
        rustix::fs::mknodat(rustix::fs::CWD, path, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    }

    /// With `eof`, an end-of-input FIFO the sandbox replaced fails the call before the data goes
    /// in; once the data went in, a failure to close the input says so (found by a review: the
    /// data went in, and the answer said nothing had, inviting the model to send it again).
    #[test]
    fn data_with_eof_goes_in_whole_or_not_at_all() {
        let (path, fd) = dir("eof");
        let t = path.join("t");
        let soon = || Instant::now() + Duration::from_millis(200);
        mkfifo(&t.join("stdin"));
        let mut reader = std::fs::OpenOptions::new().read(true).custom_flags_nonblock().open(t.join("stdin")).unwrap();
        let mut got = Vec::new();
        for (what, replace) in [("regular file", 0), ("symbolic link", 1), ("directory", 2)] {
            let eof = t.join("stdin.eof");
            match replace {
                0 => std::fs::write(&eof, b"").unwrap(),
                1 => std::os::unix::fs::symlink(path.join("elsewhere"), &eof).unwrap(),
                _ => std::fs::create_dir(&eof).unwrap(),
            }
            assert!(matches!(write(&fd, b"secret\n", true, soon()), Err(InputError::Tampered(m)) if m.contains(what)), "{what}");
            let _ = reader.read_to_end(&mut got);
            assert!(got.is_empty(), "{what}: {got:?}");
            let _ = std::fs::remove_file(&eof).or_else(|_| std::fs::remove_dir(&eof));
        }
        // A FIFO nobody holds: the data went in, the input could not be closed, and it says so.
        mkfifo(&t.join("stdin.eof"));
        assert!(matches!(write(&fd, b"secret\n", true, soon()), Err(InputError::EndNotSent(_))));
        let mut got = [0u8; 7];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"secret\n");
        std::fs::remove_dir_all(&path).unwrap();
    }

    #[test]
    fn writes_to_a_read_fifo_and_refuses_everything_else() {
        let (path, fd) = dir("kinds");
        let t = path.join("t");
        let soon = || Instant::now() + Duration::from_millis(200);
        assert_eq!(write(&fd, b"x", false, soon()), Err(InputError::Missing));
        // A FIFO nobody reads: ENXIO at once, no wait.
        mkfifo(&t.join("stdin"));
        let t0 = Instant::now();
        assert_eq!(write(&fd, b"x", false, soon()), Err(InputError::NoReader));
        assert!(t0.elapsed() < Duration::from_millis(150));
        // Read: the bytes arrive.
        let mut reader = std::fs::OpenOptions::new().read(true).custom_flags_nonblock().open(t.join("stdin")).unwrap();
        write(&fd, b"hello", false, soon()).unwrap();
        let mut got = [0u8; 5];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        // Full: the deadline, then how much went in.
        let big = vec![b'a'; 1 << 20];
        let t0 = Instant::now();
        match write(&fd, &big, false, soon()) {
            Err(InputError::Full { written: Some(written) }) => assert!(written > 0 && written < big.len()),
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(reader);
        // A regular file, a directory, a symbolic link in its place.
        std::fs::remove_file(t.join("stdin")).unwrap();
        std::fs::write(t.join("stdin"), b"").unwrap();
        assert!(matches!(write(&fd, b"x", false, soon()), Err(InputError::Tampered(m)) if m.contains("regular file")));
        assert_eq!(std::fs::read(t.join("stdin")).unwrap(), b"");
        std::fs::remove_file(t.join("stdin")).unwrap();
        std::fs::create_dir(t.join("stdin")).unwrap();
        assert!(matches!(write(&fd, b"x", false, soon()), Err(InputError::Tampered(m)) if m.contains("directory")));
        std::fs::remove_dir(t.join("stdin")).unwrap();
        mkfifo(&path.join("outside"));
        std::os::unix::fs::symlink(path.join("outside"), t.join("stdin")).unwrap();
        assert!(matches!(write(&fd, b"x", false, soon()), Err(InputError::Tampered(m)) if m.contains("symbolic link")));
        // The end marker: closed.
        std::fs::write(t.join("stdin.closed"), b"").unwrap();
        assert_eq!(write(&fd, b"x", false, soon()), Err(InputError::Closed));
        std::fs::remove_dir_all(&path).unwrap();
    }

    #[test]
    fn a_linked_task_directory_is_refused() {
        let (path, _) = dir("link");
        std::os::unix::fs::symlink("/tmp", path.join("l")).unwrap();
        let base = rustix::fs::open(&path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        assert!(matches!(open_task_dir(&base, "l"), Err(InputError::Tampered(_))));
        assert!(matches!(open_task_dir(&base, "../"), Err(InputError::Tampered(_)) | Err(InputError::Provider(_))));
        std::fs::remove_dir_all(&path).unwrap();
    }

    trait NonBlock {
        fn custom_flags_nonblock(&mut self) -> &mut Self;
    }
    impl NonBlock for std::fs::OpenOptions {
        fn custom_flags_nonblock(&mut self) -> &mut Self {
            use std::os::unix::fs::OpenOptionsExt;
            self.custom_flags(libc::O_NONBLOCK)
        }
    }
}
