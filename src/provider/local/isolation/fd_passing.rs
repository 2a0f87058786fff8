//! Descriptors passed over unix sockets (`SCM_RIGHTS`): how the keeper hands the init its
//! spawner socket and the init answers with the egress socket, how the server sends a command's
//! pipes to a spawner, and how a spawner answers with a dialed socket or a waiting shell's pipes.
//! What arrives this way from a sandbox is checked by its reader (a stream socket, pipe read
//! ends...): these two calls only move the descriptors.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The most descriptors one message carries (a command's stdout, stderr and stdin).
const MAX_FDS: usize = 3;

/// Sends `data` on `conn` with `fds` (at most [`MAX_FDS`]) attached to its first bytes, then the
/// rest of `data`. The socket's own send timeout bounds every write.
pub fn send_with_fds(conn: impl AsFd, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || (!fds.is_empty() && !control.push(rustix::net::SendAncillaryMessage::ScmRights(fds))) {
        return Err(io::Error::other(format!("no room to pass {} descriptors", fds.len())));
    }
    let sent = loop {
        match rustix::net::sendmsg(&conn, &[io::IoSlice::new(data)], &mut control, rustix::net::SendFlags::empty()) {
            Err(rustix::io::Errno::INTR) => {}
            other => break other?,
        }
    };
    let mut rest = &data[sent..];
    while !rest.is_empty() {
        match rustix::io::write(&conn, rest) {
            Ok(n) => rest = &rest[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// One `recvmsg` on `conn` into `buf`: how many bytes came, and the descriptors that came with
/// them, close-on-exec. `room` says how many the caller takes: the kernel closes the ones past
/// what that leaves space for (rounded up to the control buffer's alignment).
pub fn recv_with_fds(conn: impl AsFd, buf: &mut [u8], room: usize) -> rustix::io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let len = match room.min(MAX_FDS) {
        0 => 0,
        n => rustix::cmsg_space!(ScmRights(n)),
    };
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space[..len]);
    let got = rustix::net::recvmsg(&conn, &mut [io::IoSliceMut::new(buf)], &mut control, rustix::net::RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok((got.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_and_every_byte_arrive() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        let data = vec![b'x'; 300_000];
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 400_000];
            let (n, fds) = recv_with_fds(&b, &mut buf, 2).unwrap();
            let mut total = n;
            while total < 300_000 {
                total += recv_with_fds(&b, &mut buf, 0).unwrap().0;
            }
            (total, fds.len())
        });
        send_with_fds(&a, &data, &[r.as_fd(), w.as_fd()]).unwrap();
        assert_eq!(reader.join().unwrap(), (300_000, 2));
        assert!(send_with_fds(&a, b"x", &[r.as_fd(); 4]).is_err(), "more than fit");
    }
}
