//! The keeper zygote: a process of one thread, started once per server from this binary, that
//! forks each new keeper on the server's request.
//!
//! A keeper used to be a program started per sandbox, and its start (the exec, the dynamic
//! loader, the program's own start) was about a millisecond of every `create_sandbox` on the
//! machine measured (docs/benchmarks.md). A fork of a small process of one thread costs a tenth
//! of that, and the server itself cannot fork safely: it runs many threads.
//!
//! The zygote's stdin is a unix stream socket whose other end the server holds. One message per
//! request, `ID` and the keeper's start flag separated by a NUL (an empty flag for none), with
//! two descriptors: the keeper's stdin and stdout. The zygote forks; the child takes the two
//! descriptors as its stdin and stdout, closes every other descriptor, leads a process group of
//! its own and runs the keeper as `sandbox-mcp keeper ROOT ID SHELL [FLAG]` would (whose first
//! step forks the keeper away and exits, see `keeper::detach`). The zygote waits for that child
//! and answers with how it ended, `exit N` or `signal N` (`error WHY` when it could not fork),
//! which is what starting the keeper as a program answered. It ends when the server's end of the
//! socket closes. Its environment is the keepers' (the server starts it with theirs), and its
//! session is its own, without a controlling terminal, so that signals aimed at the server's
//! group (or terminal) do not end it mid-fork. A zygote whose program file was replaced on disk
//! (an upgrade) is replaced too at the next request: the keepers it forks start the sandbox's
//! init or spawner from their own program file, which must be the one at the server's path.
//!
//! No sandbox reaches the zygote: its socket is the server's, and each keeper it forks closes
//! every descriptor but its stdio before anything else.

use super::isolation::{fd_passing, init, stage};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The internal subcommand that runs the zygote (`keeper-zygote ROOT SHELL PLACE`).
pub(super) const SUBCOMMAND: &str = "keeper-zygote";

/// How long the server waits for the zygote's answer to one request: a fork, and the child's
/// own fork and exit (milliseconds; a zygote that takes longer is replaced at the next request).
const ANSWER_BUDGET: Duration = Duration::from_secs(5);

/// The largest request: a sandbox id and a flag.
const MAX_REQUEST: usize = 256;

/// The last argument the zygote is started with, blank: room in its command line, which every
/// keeper it forks rewrites to name its sandbox (`/proc/PID/cmdline` can only shrink in place).
fn place() -> String {
    " ".repeat(64)
}

/// How a keeper's start ended, as the zygote answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ended {
    /// The child that forks the keeper away exited with this code (0: the keeper runs).
    Exit(i32),
    /// It was ended by this signal.
    Signal(i32),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Exit(code) => write!(f, "exited with {code}"),
            Ended::Signal(signal) => write!(f, "was ended by signal {signal}"),
        }
    }
}

/// The server's side: the running zygote, started on first use and again when it died.
pub(super) struct Zygote {
    exe: PathBuf,
    root: PathBuf,
    shell: PathBuf,
    running: std::sync::Mutex<Option<Running>>,
}

/// A started zygote: the server's end of its socket, the process, and which file its program
/// was when it started.
struct Running {
    conn: UnixStream,
    child: Child,
    program: Option<FileId>,
}

/// A file's device and inode.
type FileId = (u64, u64);

/// Which file `path` is now.
fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Drop for Running {
    fn drop(&mut self) {
        // Closing the socket ends a zygote that is alive; this reaps it (or ends one that hangs).
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Zygote {
    /// A zygote for keepers of the state root `root` with the provider's `shell`, started from
    /// `exe` when first asked for a keeper.
    pub(super) fn new(exe: &Path, root: &Path, shell: &Path) -> Zygote {
        Zygote { exe: exe.into(), root: root.into(), shell: shell.into(), running: std::sync::Mutex::new(None) }
    }

    /// Starts a zygote whose keepers get environment `env`.
    fn start(&self, env: &[(String, String)]) -> io::Result<Running> {
        let program = file_id(&self.exe);
        let (ours, theirs) = UnixStream::pair()?;
        let child = Command::new(&self.exe)
            .arg(SUBCOMMAND)
            .arg(&self.root)
            .arg(&self.shell)
            .arg(place())
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        ours.set_read_timeout(Some(ANSWER_BUDGET))?;
        ours.set_write_timeout(Some(ANSWER_BUDGET))?;
        Ok(Running { conn: ours, child, program })
    }

    /// Starts the keeper of sandbox `id` with start flag `flag` (none for a keeper that starts
    /// nothing), its stdin and stdout the given descriptors; how the process that forks it away
    /// ended. A zygote that died is started again, with the keepers' environment `env` (once per
    /// call, and only while the request cannot have reached it).
    pub(super) fn launch(
        &self,
        id: &str,
        flag: Option<&str>,
        stdin: OwnedFd,
        stdout: OwnedFd,
        env: &[(String, String)],
    ) -> io::Result<Ended> {
        let request = format!("{id}\0{}", flag.unwrap_or(""));
        if request.len() > MAX_REQUEST {
            return Err(io::Error::other(format!("the sandbox id {id:?} is too long for a keeper")));
        }
        let mut running = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if running.as_ref().is_some_and(|z| z.program != file_id(&self.exe)) {
            // The program was replaced on disk since this zygote started: a new one runs it.
            *running = None;
        }
        let mut sent = false;
        for _ in 0..2 {
            let zygote = match running.as_mut() {
                Some(z) => z,
                None => running.insert(self.start(env).map_err(|e| io::Error::other(format!("could not start the keeper zygote: {e}")))?),
            };
            match fd_passing::send_with_fds(&zygote.conn, request.as_bytes(), &[stdin.as_fd(), stdout.as_fd()]) {
                Ok(()) => {
                    sent = true;
                    break;
                }
                // Dead since the last request (its end is closed): a new one.
                Err(_) => *running = None,
            }
        }
        if !sent {
            return Err(io::Error::other("the keeper zygote did not take the request"));
        }
        drop((stdin, stdout));
        let answer = running.as_mut().map(|z| read_answer(&mut z.conn));
        match answer {
            Some(Ok(ended)) => Ok(ended),
            other => {
                // A zygote that does not answer is replaced at the next request.
                *running = None;
                Err(other.and_then(Result::err).unwrap_or_else(|| io::Error::other("no keeper zygote")))
            }
        }
    }
}

/// Reads one answer line of the zygote: bounded in size, within the socket's timeout.
fn read_answer(conn: &mut UnixStream) -> io::Result<Ended> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_REQUEST {
        let read = conn.read(&mut byte).map_err(|err| match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::other(format!(
                "the keeper zygote did not answer within {} s; a new one starts at the next create",
                ANSWER_BUDGET.as_secs()
            )),
            _ => err,
        })?;
        match read {
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the keeper zygote exited without answering")),
            _ if byte[0] == b'\n' => return parse_answer(&String::from_utf8_lossy(&line)),
            _ => line.push(byte[0]),
        }
    }
    Err(io::Error::other("the keeper zygote's answer is too long"))
}

fn parse_answer(line: &str) -> io::Result<Ended> {
    let number = |s: &str| s.parse::<i32>().map_err(|_| io::Error::other(format!("the keeper zygote answered {line:?}")));
    match line.split_once(' ') {
        Some(("exit", code)) => Ok(Ended::Exit(number(code)?)),
        Some(("signal", signal)) => Ok(Ended::Signal(number(signal)?)),
        Some(("error", why)) => Err(io::Error::other(format!("the keeper zygote could not fork: {why}"))),
        _ => Err(io::Error::other(format!("the keeper zygote answered {line:?}"))),
    }
}

/// The body of `sandbox-mcp keeper-zygote ROOT SHELL PLACE`: serves requests on stdin until
/// the server's end closes.
pub(super) fn run(args: &[String]) -> anyhow::Result<()> {
    let [root, shell, _place] = args else {
        anyhow::bail!("usage: {SUBCOMMAND} ROOT SHELL PLACE");
    };
    // A session of its own, without the controlling terminal of whoever started the server (the
    // server's child, it leads no group yet).
    rustix::process::setsid()?;
    let program = std::env::args().next().unwrap_or_else(|| "sandbox-mcp".into());
    // The command line shows no blank room (the keepers' titles use it).
    let _ = stage::name_command_line(&[&program, SUBCOMMAND, root, shell], None, false);
    let conn = UnixStream::from(io::stdin().as_fd().try_clone_to_owned()?);
    let mut buf = [0u8; MAX_REQUEST];
    loop {
        let (n, fds) = match fd_passing::recv_with_fds(&conn, &mut buf, 2) {
            Ok(got) => got,
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        };
        if n == 0 {
            return Ok(());
        }
        let answer = match (std::str::from_utf8(&buf[..n]).ok().and_then(|r| r.split_once('\0')), <[OwnedFd; 2]>::try_from(fds)) {
            (Some((id, flag)), Ok([stdin, stdout])) => fork_keeper(&program, root, id, shell, flag, stdin, stdout),
            _ => "error a malformed request".to_string(),
        };
        fd_passing::send_with_fds(&conn, format!("{answer}\n").as_bytes(), &[])?;
    }
}

/// Forks the child that runs the keeper; waits for it and says how it ended.
fn fork_keeper(program: &str, root: &str, id: &str, shell: &str, flag: &str, stdin: OwnedFd, stdout: OwnedFd) -> String {
    let pid = match stage::fork() {
        Ok(Some(pid)) => pid,
        Ok(None) => stage::exit_child(move || {
            let set_up = rustix::stdio::dup2_stdin(&stdin).and_then(|()| rustix::stdio::dup2_stdout(&stdout));
            drop((stdin, stdout));
            stage::close_from_3();
            if set_up.is_err() || rustix::process::setpgid(None, None).is_err() {
                return 1;
            }
            let mut args = vec![super::keeper::KEEPER_COMMAND.to_string(), root.into(), id.into(), shell.into()];
            if !flag.is_empty() {
                args.push(flag.into());
            }
            let _ = stage::name_command_line(&[program, super::keeper::KEEPER_COMMAND, root, id, shell], None, false);
            match super::keeper::run_internal(&args) {
                Some(Ok(())) => 0,
                Some(Err(err)) => {
                    eprintln!("sandbox-mcp keeper: {err:#}");
                    1
                }
                None => 2,
            }
        }),
        Err(err) => return format!("error {err}"),
    };
    drop((stdin, stdout));
    use std::os::unix::process::ExitStatusExt;
    match init::Holder::of(pid).wait().map(|status| (status.code(), status.signal())) {
        Ok((Some(code), _)) => format!("exit {code}"),
        Ok((None, Some(signal))) => format!("signal {signal}"),
        Ok((None, None)) | Err(_) => "exit 1".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_and_bad_ones_refused() {
        assert_eq!(parse_answer("exit 0").unwrap(), Ended::Exit(0));
        assert_eq!(parse_answer("exit 1").unwrap(), Ended::Exit(1));
        assert_eq!(parse_answer("signal 9").unwrap(), Ended::Signal(9));
        assert!(parse_answer("error out of processes").unwrap_err().to_string().contains("out of processes"));
        assert!(parse_answer("exit x").is_err());
        assert!(parse_answer("").is_err());
    }
}
