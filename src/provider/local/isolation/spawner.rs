//! The spawner of an isolated sandbox: its init starts commands on the server's request, so a
//! command is born inside every namespace and cgroup of the sandbox without a host process
//! entering them (no `nsenter` exec, no extra fork on the way).
//!
//! The keeper binds a unix socket, [`SOCKET_FILE`] in the sandbox's directory on the host (out of
//! the sandbox's sight), and hands the listening socket to the init as its stdin. One connection
//! per command:
//!
//! 1. The server sends a request — a little-endian `u32` length, then JSON `{"argv": [...],
//!    "env": [[name, value], ...], "cwd": "/path" | null}`, opened by `"key"` where the sandbox
//!    has one ([`KEY_FILE`]; a request whose first bytes are not `{"key":"<the key>"` is refused
//!    before the rest is read) — with the command's stdout and stderr
//!    (the write ends of its pipes) attached (`SCM_RIGHTS`, on the first bytes), and optionally a
//!    third descriptor, its stdin.
//! 2. The init starts the command (stdin the third descriptor, else `/dev/null`; a process group
//!    of its own; the working directory inside the sandbox, the home when none) and answers
//!    `started <pid>` (the pid inside the sandbox; an init of an older version answers `started`)
//!    or `error <what failed>`. A request with `"next_env"` may instead run in the shell kept
//!    waiting for it ([`super::warm_shell`]): the answer is then `started <pid> pipes`, with that
//!    shell's stdout and stderr read ends attached, which replace the ones the server sent.
//! 3. The server may send `kill`: the init sends SIGKILL to the command's process group, while the
//!    command is not reaped yet (so the group id is still the command's).
//! 4. When the init reaps the command it sends `exit <code> <members>` or
//!    `signal <number> <members>`, `<members>` being 1 when processes of the command's group
//!    remain (they may hold its pipes), else 0.
//!
//! A request `{"prepare": true, "argv": [bash, "-c", ""], "next_env": [...], "cwd": ...}`,
//! without descriptors, sent once as the sandbox is created (it may wait in the socket's backlog
//! until the spawner serves), asks for nothing but the shell the first command will run in
//! ([`super::warm_shell`]); the spawner answers nothing, and ignores it once a command has named
//! the shell for its successor.
//!
//! A request `{"dial": <port>}`, without descriptors, asks instead for a TCP connection to the
//! port on the sandbox's own loopback interface (127.0.0.1, else ::1, within [`DIAL_BUDGET`]):
//! the init answers `dialed` with the connected socket attached, or `error <what failed>`. This
//! is how an exposed port's relay, outside the sandbox's network namespace, reaches inside it.
//!
//! A connection that closes before the end line means the init is gone: the sandbox was killed,
//! and so was the command. A server that goes away leaves its commands running, as a server that
//! started them directly would.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::fd_passing;
use super::warm_shell::{self, WarmShell};

/// The spawner's socket, in a sandbox's directory.
pub const SOCKET_FILE: &str = "spawn.sock";

/// The largest request accepted (argv and environment are bounded far below this by the tools).
const MAX_REQUEST: usize = 4 << 20;

/// The most connections that may be waiting to prove they hold the key (or, without a key, for
/// their whole request) at once. Under an unprivileged server the socket can be reached by other
/// sandboxes of the same uid, which lack the key: past this many, each new connection closes the
/// one that has waited longest, which is told `busy` and served no further. The server's own
/// requests send the key in their first bytes and wait microseconds, so a flood of silent
/// connections mostly pushes out its own; a request of the server's is pushed out only when this
/// many connections arrive between its accept and its first read, and then nothing of it runs.
const MAX_WAITING: usize = 32;

/// How long a connection may take to send the key (a few dozen bytes).
const KEY_BUDGET: Duration = Duration::from_secs(1);

/// The exit code reported when the connection closed before the end line: the init, and with it
/// every process of the sandbox, was killed (128 + SIGKILL).
pub const KILLED_WITH_THE_SANDBOX: i32 = 128 + 9;

/// How long the server waits for `started` and, after `kill`, for the end line.
const ANSWER_BUDGET: Duration = Duration::from_secs(10);

/// The longest line the server takes from an init (its lines are a few words). Sandbox code can
/// take its init over and write anything: a longer line ends the exchange as if the init were
/// gone, and is never logged.
const MAX_LINE: usize = 256;

/// How long the init tries to connect to a port of the sandbox (a listener whose backlog is full
/// would otherwise hold the dial for minutes).
pub const DIAL_BUDGET: Duration = Duration::from_secs(2);

/// What the server asks the init to start (or, with `dial`, to connect to).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Request {
    /// The sandbox's spawner key ([`KEY_FILE`] beside the socket), where it has one. First, so
    /// that it opens the serialized request (see [`key_opening`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default)]
    argv: Vec<String>,
    #[serde(default)]
    env: Vec<(String, String)>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dial: Option<u16>,
    /// With this, the command may run in a shell started ahead of it, and a shell of the same
    /// program and working directory, with this environment, is kept waiting for the next
    /// command (see [`super::warm_shell`]). The server names it only where it holds no per-call
    /// value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next_env: Option<Vec<(String, String)>>,
    /// With this (and `next_env`, and no descriptors): start nothing, only keep the shell of
    /// `argv` waiting with `next_env` for the sandbox's first command. Sent once, at create; a
    /// spawner where a command has named the shell for its successor already ignores it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    prepare: bool,
}

impl Request {
    /// The request as sent: its length (little-endian `u32`), then its JSON, at most
    /// [`MAX_REQUEST`] bytes of it.
    fn framed(&self) -> io::Result<Vec<u8>> {
        let body = serde_json::to_vec(self).map_err(io::Error::other)?;
        let len = u32::try_from(body.len()).ok().filter(|n| (*n as usize) <= MAX_REQUEST).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("the command and its environment are too large ({} bytes)", body.len()))
        })?;
        Ok([len.to_le_bytes().as_slice(), &body].concat())
    }
}

/// The bytes that open a request carrying `key`: what a spawner checks before it reads on.
/// (Spawners of earlier versions parse the whole request and find the key wherever it is.)
fn key_opening(key: &str) -> Vec<u8> {
    format!(r#"{{"key":{}"#, serde_json::Value::from(key)).into_bytes()
}

/// The file beside a spawner's socket that holds the key every request must carry (a
/// Landlock-tier sandbox's: other sandboxes of the same uid can connect to its socket, since
/// Landlock does not cover a connect to a named socket on every kernel, but cannot read this
/// file outside their home). An isolated sandbox's init needs none: nothing inside reaches the
/// host's file system.
pub const KEY_FILE: &str = "spawner.key";

/// The longest key read.
const MAX_KEY: u64 = 128;

/// Makes a new key in sandbox directory `dir` (mode 0600); returns it.
pub fn make_key(dir: &Path) -> io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let key = crate::ids::random_hex(16);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dir.join(KEY_FILE))?;
    f.write_all(key.as_bytes())?;
    Ok(key)
}

/// The key in sandbox directory `dir`, if it has one: a regular file (no link followed) of at
/// most [`MAX_KEY`] bytes.
pub fn read_key(dir: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(KEY_FILE))
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))?;
    let mut text = String::new();
    f.take(MAX_KEY).read_to_string(&mut text).ok()?;
    let key = text.trim().to_string();
    (!key.is_empty()).then_some(key)
}

/// Whether `given` is `key`, compared in time independent of where they differ.
fn same_key(given: Option<&[u8]>, key: &[u8]) -> bool {
    let Some(given) = given else { return false };
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Where a sandbox's spawner listens, and the key its requests carry (a Landlock-tier spawner
/// wants one; the init of a namespace-tier sandbox none).
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The spawner's unix socket.
    pub socket: PathBuf,
    /// The key its requests carry, if it wants one.
    pub key: Option<String>,
}

impl Endpoint {
    /// The spawner of the sandbox in directory `dir`, with the key kept there when `keyed`.
    pub fn in_dir(dir: &Path, keyed: bool) -> Endpoint {
        Endpoint { socket: dir.join(SOCKET_FILE), key: if keyed { read_key(dir) } else { None } }
    }
}

/// Connects to the spawner at `to`; the connect (a full backlog) and every write (a spawner that
/// stops reading) give up after `budget`, so a sandbox that stalls its spawner costs the call its
/// deadline, never a worker for good.
fn connect(to: &Endpoint, budget: Duration) -> io::Result<UnixStream> {
    connect_within(&to.socket, budget)
}

/// Connects to the unix socket at `path` within `budget` (a listener whose backlog is full
/// would otherwise hold the connect for as long as it does not accept); writes on the
/// connection keep that budget.
pub fn connect_within(path: &Path, budget: Duration) -> io::Result<UnixStream> {
    use rustix::net::{sockopt, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(budget.max(Duration::from_millis(1))))?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(UnixStream::from(fd))
}

/// Asks the spawner at `to` for a TCP connection to `port` on the sandbox's own loopback
/// interface. The error says what failed (nothing listens, the sandbox is gone...).
pub fn dial(to: &Endpoint, port: u16) -> io::Result<std::net::TcpStream> {
    let conn = connect(to, ANSWER_BUDGET)?;
    let request = Request { dial: Some(port), key: to.key.clone(), ..Request::default() };
    (&conn).write_all(&request.framed()?)?;
    conn.set_read_timeout(Some(DIAL_BUDGET + ANSWER_BUDGET))?;
    let mut line = [0u8; MAX_LINE];
    let (got, mut fds) = fd_passing::recv_with_fds(&conn, &mut line, 1)?;
    let first_line = line[..got].split(|b| *b == b'\n').next().unwrap_or_default();
    let text = plain(first_line);
    let text = text.trim_end();
    match (text, fds.pop(), fds.is_empty()) {
        ("dialed", Some(fd), true) => {
            // Whatever the init sent, only a connected stream socket is relayed.
            let is_stream = rustix::net::sockopt::socket_type(&fd).is_ok_and(|t| t == rustix::net::SocketType::STREAM);
            if !is_stream {
                return Err(io::Error::other("the sandbox's init answered with something that is not a stream socket"));
            }
            Ok(std::net::TcpStream::from(fd))
        }
        (t, _, _) if t.starts_with("error ") => Err(io::Error::new(io::ErrorKind::ConnectionRefused, t["error ".len()..].to_string())),
        ("", _, _) => Err(io::Error::new(io::ErrorKind::NotFound, "the sandbox's init is gone")),
        _ => Err(io::Error::other("the sandbox's init gave an answer that is not one")),
    }
}

/// How long the server gives a spawner to take a request to prepare a shell (a fresh spawner,
/// which no sandbox code has run beside yet, takes it at once).
const PREPARE_BUDGET: Duration = Duration::from_secs(1);

/// Asks the spawner at `to` to keep `program` (a bash) waiting, in `cwd` and with `next_env`
/// (the sandbox's environment and the task tag the server gives its first command), for the
/// sandbox's first command, so that it starts as the ones after it do. Sent once, while the
/// sandbox is created, before its keeper starts the spawner (the request waits in the socket's
/// backlog); nothing is read back (the spawner answers nothing), so this costs the create a
/// connect and a write.
pub fn prepare(to: &Endpoint, program: &str, cwd: Option<&str>, next_env: Vec<(String, String)>) -> io::Result<()> {
    let request = Request {
        key: to.key.clone(),
        argv: vec![program.to_string(), "-c".to_string(), String::new()],
        cwd: cwd.map(str::to_string),
        next_env: Some(next_env),
        prepare: true,
        ..Request::default()
    };
    let bytes = request.framed()?;
    // Nobody reads the socket yet: what a fresh socket's buffer takes at once, never a wait.
    if bytes.len() > PREPARE_MAX {
        return Err(io::Error::other(format!("the environment is large ({} bytes); the first command starts its own shell", bytes.len())));
    }
    let conn = connect(to, PREPARE_BUDGET)?;
    (&conn).write_all(&bytes)
}

/// The largest request to prepare a shell sent (far below what a unix socket's buffer holds).
const PREPARE_MAX: usize = 64 << 10;

/// A line from an init or spawner as text fit for a log or an answer: sandbox code that took its
/// init over chooses these bytes, and models read them. Printable ASCII stays, and so do letters
/// and digits of any script (an error may name a path such as `/srv/café`); everything else
/// becomes `?`: control characters (terminal escapes among them), format and invisible
/// characters (bidirectional overrides, zero-width ones, tag characters that spell hidden text,
/// variation selectors), blank letters, private-use and unassigned code points, bytes that are
/// not UTF-8, and non-ASCII punctuation and symbols with them.
fn plain(line: &[u8]) -> String {
    // Letters that show nothing: the Hangul and Khmer fillers.
    let blank = |c: char| matches!(c, '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}' | '\u{3164}' | '\u{ffa0}');
    let shown = |c: char| c.is_ascii_graphic() || c == ' ' || (!c.is_ascii() && c.is_alphanumeric() && !blank(c));
    String::from_utf8_lossy(line).chars().map(|c| if shown(c) { c } else { '?' }).collect()
}

/// How a command ended, as the init saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The exit status; 128 + N when killed by signal N.
    pub code: i32,
    /// Whether processes of the command's group remained when it was reaped.
    pub members_left: bool,
}

// ---------------------------------------------------------------------------------------------
// Server side

/// A command the init of a sandbox started for this server.
pub struct Remote {
    conn: UnixStream,
    pending: Vec<u8>,
    ended: Option<Ended>,
    pid: Option<u32>,
}

impl Remote {
    /// Asks the spawner at `to` to run `argv` with exactly `env`, from `cwd` (inside
    /// the sandbox; its home when `None`), with stdout and stderr the given pipe ends (the caller
    /// closes its own copies once this returns), and stdin `stdin` (`/dev/null` when `None`).
    /// Returns once the command runs.
    pub fn spawn(
        to: &Endpoint,
        argv: &[String],
        env: Vec<(String, String)>,
        cwd: Option<&str>,
        stdout: impl AsFd,
        stderr: impl AsFd,
        stdin: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> io::Result<Remote> {
        Remote::start(to, Job { argv, env, cwd, next_env: None }, stdout, stderr, stdin).map(|(remote, _)| remote)
    }

    /// As [`Remote::spawn`], for `job`; when the command runs in a shell that waited for it
    /// ([`Job::next_env`]), also the read ends of that shell's stdout and stderr, which are then the
    /// command's output (the pipe ends given here go unused).
    pub fn start(
        to: &Endpoint,
        job: Job<'_>,
        stdout: impl AsFd,
        stderr: impl AsFd,
        stdin: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> io::Result<(Remote, Option<[File; 2]>)> {
        let conn = connect(to, ANSWER_BUDGET)?;
        let key = to.key.clone();
        let Job { argv, env, cwd, next_env } = job;
        let message = Request { argv: argv.to_vec(), env, cwd: cwd.map(str::to_string), key, next_env, ..Request::default() }.framed()?;
        let mut fds = vec![stdout.as_fd(), stderr.as_fd()];
        fds.extend(stdin);
        fd_passing::send_with_fds(&conn, &message, &fds)?;
        let mut remote = Remote { conn, pending: Vec::new(), ended: None, pid: None };
        let deadline = Instant::now() + ANSWER_BUDGET;
        let passed = remote.receive_first(deadline)?;
        match remote.read_line(Some(deadline))? {
            Some(line) if line == "started" || line.starts_with("started ") => {
                let mut words = line.split(' ').skip(1);
                remote.pid = words.next().and_then(|pid| pid.parse().ok()).filter(|pid| *pid > 1);
                if words.next() != Some("pipes") {
                    return Ok((remote, None));
                }
                match output_pipes(passed) {
                    Ok(pipes) => Ok((remote, Some(pipes))),
                    Err(err) => {
                        // Its output would go nowhere this server reads: stop it.
                        remote.kill();
                        Err(err)
                    }
                }
            }
            Some(line) => Err(io::Error::other(line.strip_prefix("error ").unwrap_or(&line).to_string())),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "the sandbox's init is gone")),
        }
    }

    /// The first bytes of the answer to a spawn request, into `pending`, and the descriptors
    /// that came with them (a shell that waited for the command sends its pipes there), by
    /// `deadline`.
    fn receive_first(&mut self, deadline: Instant) -> io::Result<Vec<OwnedFd>> {
        let mut buf = [0u8; MAX_LINE];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the sandbox's init did not answer in time"));
            }
            self.conn.set_read_timeout(Some(left))?;
            match fd_passing::recv_with_fds(&self.conn, &mut buf, 2) {
                Ok((got, fds)) => {
                    self.pending.extend_from_slice(&buf[..got]);
                    return Ok(fds);
                }
                Err(rustix::io::Errno::INTR) => {}
                // Read on by `read_line`, which takes a reset as the init's end.
                Err(rustix::io::Errno::CONNRESET) => return Ok(Vec::new()),
                Err(rustix::io::Errno::AGAIN) => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the sandbox's init did not answer in time"));
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// The command's pid (and process group) inside the sandbox, when the init told it.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Waits for the end of the command at most `budget` (a command handed over to its task).
    pub fn wait_within(&mut self, budget: Duration) -> io::Result<Ended> {
        self.wait_until(Instant::now() + budget)
    }

    /// A handle that can ask for the command's group to be killed from another thread (server
    /// shutdown).
    pub fn killer(&self) -> io::Result<UnixStream> {
        self.conn.try_clone()
    }

    /// Asks the init to SIGKILL the command's process group. `false` when the request could not
    /// be sent (the init is gone, and the command with it).
    pub fn kill(&self) -> bool {
        send_kill(&self.conn)
    }

    /// The end of the command, if it has ended; never blocks.
    pub fn try_wait(&mut self) -> io::Result<Option<Ended>> {
        if self.ended.is_none() {
            self.conn.set_nonblocking(true)?;
            let line = self.read_line(None);
            self.conn.set_nonblocking(false)?;
            match line {
                Ok(line) => self.ended = Some(parse_end(line.as_deref())),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
        Ok(self.ended)
    }

    /// Waits for the end of the command (after [`Remote::kill`]), at most [`ANSWER_BUDGET`].
    pub fn wait(&mut self) -> io::Result<Ended> {
        self.wait_until(Instant::now() + ANSWER_BUDGET)
    }

    /// Waits for the end line until `deadline`.
    fn wait_until(&mut self, deadline: Instant) -> io::Result<Ended> {
        if let Some(ended) = self.ended {
            return Ok(ended);
        }
        let line = self.read_line(Some(deadline))?;
        let ended = parse_end(line.as_deref());
        self.ended = Some(ended);
        Ok(ended)
    }

    /// One line from the init (without its newline), `None` at end of file or when the line
    /// grows past [`MAX_LINE`]. With `deadline`, a blocking read that ends by then (however
    /// slowly the bytes come): `TimedOut` after it; without, the socket's own mode decides.
    fn read_line(&mut self, deadline: Option<Instant>) -> io::Result<Option<String>> {
        let mut buf = [0u8; MAX_LINE];
        loop {
            if let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                return Ok(Some(plain(&line[..at])));
            }
            if self.pending.len() > MAX_LINE {
                log::warn!("a sandbox's init sent a line longer than {MAX_LINE} bytes; taking it as gone");
                self.pending.clear();
                return Ok(None);
            }
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the sandbox's init did not answer in time"));
                }
                self.conn.set_read_timeout(Some(left))?;
            }
            match (&self.conn).read(&mut buf) {
                Ok(0) => return Ok(None),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                // An init that dies with a request of ours unread (a `kill` racing the sandbox's
                // own end) resets the connection: that is its end too.
                Err(err) if err.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
                // The receive timeout ran out (EAGAIN): the deadline has passed.
                Err(err) if deadline.is_some() && matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the sandbox's init did not answer in time"));
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// A command for a spawner to start ([`Remote::start`]).
pub struct Job<'a> {
    /// The program and its arguments.
    pub argv: &'a [String],
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its working directory inside the sandbox; the home when `None`.
    pub cwd: Option<&'a str>,
    /// With this, it may run in a shell that waited for it, and a shell of its program and
    /// working directory, with this environment, waits for the next command (only an
    /// environment without per-call values: see [`super::warm_shell`]).
    pub next_env: Option<Vec<(String, String)>>,
}

/// The two descriptors a spawner sent as a command's stdout and stderr, taken only as the read
/// ends of pipes (whatever sandbox code made its spawner send).
fn output_pipes(fds: Vec<OwnedFd>) -> io::Result<[File; 2]> {
    let refused = || io::Error::other("the sandbox's spawner answered without the command's output pipes");
    let Ok([stdout, stderr]) = <[OwnedFd; 2]>::try_from(fds) else { return Err(refused()) };
    let read_end = |fd: &OwnedFd| {
        let fifo = rustix::fs::fstat(fd).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo);
        let read_only = rustix::fs::fcntl_getfl(fd).is_ok_and(|flags| (flags & rustix::fs::OFlags::RWMODE) == rustix::fs::OFlags::RDONLY);
        fifo && read_only
    };
    if !(read_end(&stdout) && read_end(&stderr)) {
        return Err(refused());
    }
    Ok([File::from(stdout), File::from(stderr)])
}

/// Sends `kill` on a spawner connection.
pub fn send_kill(conn: &UnixStream) -> bool {
    let mut conn = conn;
    conn.write_all(b"kill\n").is_ok()
}

/// Reads an end line; a missing or unreadable one means the sandbox (and the command) was killed.
fn parse_end(line: Option<&str>) -> Ended {
    let killed = Ended { code: KILLED_WITH_THE_SANDBOX, members_left: false };
    let Some(line) = line else {
        return killed;
    };
    let mut it = line.split(' ');
    let (kind, number, members) = (it.next(), it.next().and_then(|n| n.parse::<i32>().ok()), it.next());
    let members_left = members == Some("1");
    match (kind, number) {
        (Some("exit"), Some(code)) => Ended { code, members_left },
        (Some("signal"), Some(signal)) => Ended { code: 128 + signal, members_left },
        _ => {
            // What the init sent is the sandbox's to choose: its length only goes to the log.
            log::warn!("a sandbox's spawner sent {} bytes that are not an end line; taking the command as killed", line.len());
            killed
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Init side

/// Binds the spawner's socket in sandbox directory `dir` (only its owner may connect). `None`
/// (logged) when it cannot be bound, for instance when the path is too long for a socket address.
pub fn bind(dir: &Path) -> Option<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(SOCKET_FILE);
    let _ = std::fs::remove_file(&path);
    let bound = UnixListener::bind(&path)
        .and_then(|listener| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map(|()| listener));
    match bound {
        Ok(listener) => Some(listener),
        Err(err) => {
            log::warn!("could not bind {}: {err}", path.display());
            None
        }
    }
}

/// The commands the init started and has not reaped, with the connection each one's end goes to.
struct Children {
    by_pid: Mutex<HashMap<i32, Started>>,
    /// Signalled when a command starts, so a reaper with nothing to wait for looks again at once.
    started: Condvar,
    /// The working directory of a command whose request names none.
    home: PathBuf,
    /// The key every request must open with, if any.
    key: Option<String>,
    /// Connections that have not shown the key yet.
    waiting: Waiting,
    /// `/dev/null`, opened once before any command ran: the stdin of a command that has none.
    /// Sandbox root may later put a FIFO at that path, whose blocking open would hang each start.
    null: Option<File>,
    /// A shell waiting for the next command (see [`super::warm_shell`]). Lock it after
    /// `by_pid`, never before.
    warm: Mutex<Option<WarmShell>>,
    /// The environment the newest command asked its successor's waiting shell for (the task tag
    /// the server gives the next command): a command that ends after a newer one started keeps no
    /// shell with its older, already taken tag. Locked only while `by_pid` is.
    newest_next: Mutex<Option<Vec<(String, String)>>>,
}

/// A command started and not reaped yet.
struct Started {
    /// The connection its end goes to.
    conn: UnixStream,
    /// The shell to keep waiting for the next command once it has ended (started then, not
    /// beside it: bash's start would take the processors it runs on).
    next: Option<Next>,
    /// Its environment, when it may run in a waiting shell: no shell is kept waiting with the
    /// environment (and so the task tag) of a command still running.
    env: Option<Vec<(String, String)>>,
}

/// What a shell waiting for the next command is started with.
struct Next {
    program: String,
    env: Vec<(String, String)>,
    cwd: Option<String>,
}

impl Children {
    /// Records command `pid` in `by_pid` (held); where it names a shell for its successor, that
    /// is now the newest.
    fn record(&self, by_pid: &mut HashMap<i32, Started>, pid: i32, started: Started) {
        if let Some(next) = &started.next {
            *self.newest_next.lock().unwrap_or_else(PoisonError::into_inner) = Some(next.env.clone());
        }
        by_pid.insert(pid, started);
    }

    /// Keeps a shell waiting for the sandbox's first command with `next`, unless a command has
    /// named the shell for its successor already (whose tag is newer).
    fn prepare_first(&self, next: &Next) {
        {
            let _by_pid = self.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
            let mut newest = self.newest_next.lock().unwrap_or_else(PoisonError::into_inner);
            if newest.is_some() {
                return;
            }
            *newest = Some(next.env.clone());
        }
        // (A command that names a newer shell meanwhile makes this one ask for nothing.)
        self.prepare(next);
    }

    /// Keeps a shell waiting for the next command of `next`, unless one does already or a newer
    /// command has named another (whose tag the server gives next); drops one made for another
    /// (it exits having run nothing). A shell that cannot start (a full process limit) is not
    /// retried until the next command.
    fn prepare(&self, next: &Next) {
        let by_pid = self.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
        // A command that took this environment's tag and started cold (two commands at once)
        // still runs: a shell carrying its tag would look like a process of its task.
        if by_pid.values().any(|started| started.env.as_ref() == Some(&next.env)) {
            return;
        }
        if self.newest_next.lock().unwrap_or_else(PoisonError::into_inner).as_ref() != Some(&next.env) {
            return;
        }
        // (`by_pid` stays locked while the shell starts, so that no such command starts meanwhile.)
        let mut warm = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        if warm.as_ref().is_some_and(|shell| shell.serves(&next.program, &next.env, next.cwd.as_deref())) {
            return;
        }
        drop(warm.take());
        let dir = next.cwd.as_deref().map_or(self.home.as_path(), Path::new);
        *warm = WarmShell::start(&next.program, &next.env, next.cwd.as_deref(), dir).ok();
        drop((warm, by_pid));
        self.started.notify_one();
    }
}

/// Connections not past the key check yet (without a key: whose request is still being read),
/// oldest first, each under a ticket.
#[derive(Default)]
struct Waiting {
    conns: Mutex<VecDeque<(u64, UnixStream)>>,
    next: AtomicU64,
}

impl Waiting {
    /// Takes `conn` in, first pushing out the connections that have waited longest while
    /// [`MAX_WAITING`] wait (each is told `busy`, without waiting, and shut); `None` when it
    /// cannot be tracked (no descriptor left to copy it).
    fn admit(&self, conn: &UnixStream) -> Option<u64> {
        let copy = conn.try_clone().ok()?;
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        while conns.len() >= MAX_WAITING {
            if let Some((_, oldest)) = conns.pop_front() {
                let busy = b"error busy: more connections wait to send their request than the spawner takes at once; try again\n";
                let _ = rustix::net::send(&oldest, busy, rustix::net::SendFlags::DONTWAIT);
                let _ = oldest.shutdown(std::net::Shutdown::Both);
            }
        }
        conns.push_back((ticket, copy));
        Some(ticket)
    }

    /// The connection of `ticket` waits no more; whether it was still waiting, which a pushed-out
    /// one is not. (A request already sent stays readable after the shutdown: it must not run.)
    fn done(&self, ticket: u64) -> bool {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let before = conns.len();
        conns.retain(|(t, _)| *t != ticket);
        conns.len() < before
    }
}

/// Serves spawn requests on `listener` and reaps every child and orphan, forever (the body of a
/// sandbox's init once it is ready, and of a Landlock-tier sandbox's spawner). A request without
/// a working directory runs in `home`; with `key`, a request that does not carry it is refused.
pub fn serve(listener: UnixListener, home: PathBuf, key: Option<String>) -> ! {
    let children = Arc::new(Children {
        by_pid: Mutex::new(HashMap::new()),
        started: Condvar::new(),
        home,
        key,
        null: File::open("/dev/null").ok(),
        waiting: Waiting::default(),
        warm: Mutex::new(None),
        newest_next: Mutex::new(None),
    });
    let reaper = children.clone();
    if std::thread::Builder::new().name("reaper".into()).stack_size(64 * 1024).spawn(move || reap(&reaper)).is_err() {
        // Without a reaper thread, reap here and serve nothing: commands fall back to nsenter.
        drop(listener);
        reap(&children);
    }
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                let Some(ticket) = children.waiting.admit(&conn) else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let serving = children.clone();
                let spawned =
                    std::thread::Builder::new().name("spawn".into()).stack_size(64 * 1024).spawn(move || answer(conn, ticket, &serving));
                if spawned.is_err() {
                    children.waiting.done(ticket);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Reaps children forever; a reaped command's end goes to its connection.
fn reap(children: &Children) -> ! {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                let pid = pid.as_raw_nonzero().get();
                let mut by_pid = children.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(Started { mut conn, next, .. }) = by_pid.remove(&pid) {
                    drop(by_pid);
                    let members =
                        u8::from(rustix::process::Pid::from_raw(pid).is_some_and(|g| rustix::process::test_kill_process_group(g).is_ok()));
                    let line = match (status.exit_status(), status.terminating_signal()) {
                        (Some(code), _) => format!("exit {code} {members}\n"),
                        (None, Some(signal)) => format!("signal {signal} {members}\n"),
                        (None, None) => format!("signal 9 {members}\n"),
                    };
                    let _ = conn.write_all(line.as_bytes());
                    if let Some(next) = next {
                        children.prepare(&next);
                    }
                } else {
                    // A waiting shell that ended (sandbox code killed it): the next command
                    // starts cold.
                    let mut warm = children.warm.lock().unwrap_or_else(PoisonError::into_inner);
                    if warm.as_ref().is_some_and(|shell| shell.pid() == pid) {
                        drop(warm.take());
                    }
                }
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                // No child at all: wait for a command to start (an orphan can only come from a
                // child, but commands entered with nsenter leave orphans too: look again soon).
                let by_pid = children.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
                let _ = children.started.wait_timeout(by_pid, Duration::from_millis(20));
            }
        }
    }
}

/// Serves one connection: reads the request, starts the command, then obeys `kill` until the
/// server closes the connection.
fn answer(conn: UnixStream, ticket: u64, children: &Children) {
    // A request that never comes whole, or comes a byte at a time, costs this thread its
    // budget, not forever.
    let received = receive(&conn, Instant::now() + ANSWER_BUDGET, children.key.as_deref(), || children.waiting.done(ticket));
    // A request given up before it passed waits no more either.
    children.waiting.done(ticket);
    let _ = conn.set_read_timeout(None);
    if let (Some(key), Ok((request, _))) = (&children.key, &received) {
        if !same_key(request.key.as_deref().map(str::as_bytes), key.as_bytes()) {
            let _ = (&conn).write_all(b"error refused: the request does not carry this sandbox's spawner key\n");
            return;
        }
    }
    if let Ok((Request { dial: Some(port), .. }, _)) = &received {
        answer_dial(&conn, *port);
        return;
    }
    if let Ok((request @ Request { prepare: true, next_env: Some(env), .. }, None)) = &received {
        if let Some(program) = request.argv.first().filter(|_| warm_shell::fits(&request.argv, env)) {
            children.prepare_first(&Next { program: program.clone(), env: env.clone(), cwd: request.cwd.clone() });
        }
        return;
    }
    let started = received.and_then(|(request, fds)| match fds {
        Some(fds) => start(request, fds, &conn, children),
        None => Err(io::Error::new(io::ErrorKind::InvalidData, "malformed spawn request: it must carry two or three descriptors")),
    });
    let pid = match started {
        Ok(pid) => pid,
        Err(err) => {
            let _ = (&conn).write_all(format!("error {}\n", err.to_string().replace('\n', " ")).as_bytes());
            return;
        }
    };
    let mut lines = BufReader::new(&conn);
    let mut line = String::new();
    while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
        if line.trim_end() == "kill" {
            let by_pid = children.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
            // Only while the command is unreaped does its group id surely name its group.
            if pid > 1 && by_pid.contains_key(&pid) {
                if let Some(group) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
                }
            }
        }
        line.clear();
    }
}

/// The descriptors of one command: stdout, stderr and perhaps stdin.
struct Stdio3 {
    stdout: OwnedFd,
    stderr: OwnedFd,
    stdin: Option<OwnedFd>,
}

/// Connects to `port` on this network namespace's loopback interface and sends the socket on
/// `conn`, or says why not.
fn answer_dial(conn: &UnixStream, port: u16) {
    let mut refused = None;
    for ip in [std::net::IpAddr::from([127, 0, 0, 1]), std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST)] {
        match std::net::TcpStream::connect_timeout(&std::net::SocketAddr::new(ip, port), DIAL_BUDGET) {
            Ok(stream) => {
                let _ = fd_passing::send_with_fds(conn, b"dialed\n", &[stream.as_fd()]);
                return;
            }
            Err(err) => {
                refused.get_or_insert(err);
            }
        }
    }
    let why = match refused {
        Some(err) if err.kind() == io::ErrorKind::ConnectionRefused => format!("nothing listens on port {port} inside the sandbox"),
        Some(err) => format!("connecting to port {port} inside the sandbox failed: {err}"),
        None => format!("connecting to port {port} inside the sandbox failed"),
    };
    let _ = (conn as &UnixStream).write_all(format!("error {why}\n").as_bytes());
}

/// Sets the read timeout of `conn` to what is left until `deadline`; fails once nothing is.
fn budget_reads(conn: &UnixStream, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "the spawn request did not come whole in time"));
    }
    conn.set_read_timeout(Some(left))
}

/// Reads from `conn` into `data` until it holds `want` bytes, by `deadline` (through `buf`,
/// never more than asked).
fn fill(conn: &UnixStream, deadline: Instant, data: &mut Vec<u8>, want: usize, buf: &mut [u8]) -> io::Result<()> {
    while data.len() < want {
        budget_reads(conn, deadline)?;
        let take = (want - data.len()).min(buf.len());
        let n = (conn as &UnixStream).read(&mut buf[..take])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the spawn request ended early"));
        }
        data.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// Reads one request and the two or three descriptors attached to it (none for a dial), all of
/// it by `deadline`. What is kept grows with what arrives, up to [`MAX_REQUEST`]. With `key`,
/// the request must open with it within [`KEY_BUDGET`] and nothing more is read until it has;
/// without, it is refused. `passed` is asked once the request is known good (with a key, once
/// the key is; else once it is whole): whether it may still be served (a connection pushed out
/// meanwhile may not).
fn receive(
    conn: &UnixStream,
    deadline: Instant,
    key: Option<&str>,
    passed: impl FnOnce() -> bool,
) -> io::Result<(Request, Option<Stdio3>)> {
    let opening = key.map(key_opening);
    let first = if opening.is_some() { deadline.min(Instant::now() + KEY_BUDGET) } else { deadline };
    budget_reads(conn, first)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (got, mut fds) = fd_passing::recv_with_fds(conn, &mut buf, 3)?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("malformed spawn request: {what}"));
    let stdin = if fds.len() == 3 { fds.pop() } else { None };
    let stdio = match (fds.pop(), fds.pop(), fds.is_empty()) {
        (Some(stderr), Some(stdout), true) => Some(Stdio3 { stdout, stderr, stdin }),
        (None, None, true) => None,
        _ => return Err(bad("it must carry two or three descriptors")),
    };
    let mut data = buf[..got].to_vec();
    if let Some(opening) = &opening {
        fill(conn, first, &mut data, 4 + opening.len(), &mut buf)?;
        if !same_key(data.get(4..4 + opening.len()), opening) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "refused: the request does not open with this sandbox's spawner key (a server of an earlier version sends it last: run the server of the version that started the sandbox)",
            ));
        }
    }
    let pushed_out = || io::Error::new(io::ErrorKind::ConnectionAborted, "busy: the connection was pushed out by newer ones; try again");
    let mut passed = Some(passed);
    if opening.is_some() && !passed.take().is_some_and(|passed| passed()) {
        return Err(pushed_out());
    }
    fill(conn, deadline, &mut data, 4, &mut buf)?;
    let len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
    if len > MAX_REQUEST || data.len() > 4 + len {
        return Err(bad("wrong length"));
    }
    fill(conn, deadline, &mut data, 4 + len, &mut buf)?;
    let request: Request = serde_json::from_slice(&data[4..]).map_err(|e| bad(&e.to_string()))?;
    if passed.is_some_and(|passed| !passed()) {
        return Err(pushed_out());
    }
    Ok((request, stdio))
}

/// Starts the command of `request` and records it (answering `started <pid>` under the same lock,
/// so the end line can never come first): in the shell waiting for it where there is one, else
/// as a new process; then, where the request allows it, keeps a shell waiting for the next one.
fn start(request: Request, fds: Stdio3, conn: &UnixStream, children: &Children) -> io::Result<i32> {
    let next = request.next_env.as_ref().zip(request.argv.first()).filter(|(next_env, _)| {
        fds.stdin.is_none() && warm_shell::fits(&request.argv, &request.env) && warm_shell::fits(&request.argv, next_env)
    });
    let next = next.map(|(env, program)| Next { program: program.clone(), env: env.clone(), cwd: request.cwd.clone() });
    let env = next.as_ref().map(|_| request.env.clone());
    let record = Started { conn: conn.try_clone()?, next, env };
    if record.next.is_some() {
        match start_waiting(&request, record, conn, children)? {
            Ok(pid) => return Ok(pid),
            Err(record) => return start_cold(&request, fds, record, conn, children),
        }
    }
    start_cold(&request, fds, record, conn, children)
}

/// Starts the command of `request` as a new process.
fn start_cold(request: &Request, fds: Stdio3, record: Started, conn: &UnixStream, children: &Children) -> io::Result<i32> {
    let Some((program, args)) = request.argv.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"));
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .current_dir(request.cwd.as_deref().map_or(children.home.as_path(), Path::new))
        .stdin(match (fds.stdin, &children.null) {
            (Some(fd), _) => Stdio::from(fd),
            (None, Some(null)) => Stdio::from(null.try_clone()?),
            (None, None) => Stdio::null(),
        })
        .stdout(Stdio::from(fds.stdout))
        .stderr(Stdio::from(fds.stderr))
        .process_group(0);
    let mut by_pid = children.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
    // The child is never waited for through `Child`: the reaper reaps it.
    let child = cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("could not start {program}: {e}")))?;
    let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
    children.record(&mut by_pid, pid, record);
    (conn as &UnixStream).write_all(format!("started {pid}\n").as_bytes())?;
    drop(by_pid);
    children.started.notify_one();
    Ok(pid)
}

/// Runs the script of `request` (`bash -c SCRIPT`) in the shell waiting for it, if one waits
/// for this program, environment and working directory and takes the script; answers
/// `started <pid> pipes` with the shell's stdout and stderr attached. `Ok(Err(record))`: start
/// it cold.
fn start_waiting(request: &Request, record: Started, conn: &UnixStream, children: &Children) -> io::Result<Result<i32, Started>> {
    let [program, _, script] = request.argv.as_slice() else { return Ok(Err(record)) };
    // Under `by_pid`: the reaper, which takes it before it looks at the waiting shell, either
    // has dropped a shell it reaped or will find the command recorded.
    let mut by_pid = children.by_pid.lock().unwrap_or_else(PoisonError::into_inner);
    let taken = {
        let mut warm = children.warm.lock().unwrap_or_else(PoisonError::into_inner);
        warm.take_if(|shell| shell.serves(program, &request.env, request.cwd.as_deref()))
    };
    let Some(shell) = taken else { return Ok(Err(record)) };
    let pid = shell.pid();
    // All or nothing: a shell that did not take its script runs none of it.
    let Ok((stdout, stderr)) = shell.hand(script) else { return Ok(Err(record)) };
    children.record(&mut by_pid, pid, record);
    fd_passing::send_with_fds(conn, format!("started {pid} pipes\n").as_bytes(), &[stdout.as_fd(), stderr.as_fd()])?;
    drop(by_pid);
    children.started.notify_one();
    Ok(Ok(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake init on a socket in a fresh directory: answers one dial request with `answer`
    /// and, when given, a descriptor.
    fn fake_init(answer: &'static [u8], fd: Option<OwnedFd>) -> (std::path::PathBuf, std::thread::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!("smcp-dial-{}", crate::ids::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(SOCKET_FILE);
        let listener = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let (request, stdio) = receive(&conn, Instant::now() + ANSWER_BUDGET, None, || true).unwrap();
            assert_eq!((request.dial, stdio.is_none()), (Some(8000), true));
            let fds: Vec<_> = fd.iter().map(|fd| fd.as_fd()).collect();
            fd_passing::send_with_fds(&conn, answer, &fds).unwrap();
        });
        (dir, t)
    }

    /// A fake spawner on a socket in a fresh directory: takes one spawn request, answers
    /// `answer` with `fds` attached, and returns the next line the server sent (`kill`), if any
    /// within a second.
    fn fake_spawner(answer: &'static [u8], fds: Vec<OwnedFd>) -> (std::path::PathBuf, std::thread::JoinHandle<String>) {
        let dir = std::env::temp_dir().join(format!("smcp-spawn-{}", crate::ids::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join(SOCKET_FILE)).unwrap();
        let t = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let (request, stdio) = receive(&conn, Instant::now() + ANSWER_BUDGET, None, || true).unwrap();
            assert!(request.next_env.is_some() && stdio.is_some());
            let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
            fd_passing::send_with_fds(&conn, answer, &borrowed).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut line = String::new();
            let _ = BufReader::new(&conn).read_line(&mut line);
            line
        });
        (dir, t)
    }

    /// A shell that waited for its command sends its own stdout and stderr with `started`: the
    /// server takes only the read ends of two pipes there, and stops a command whose answer
    /// carries anything else (its output would go where this server does not read).
    #[test]
    fn a_waiting_shells_pipes_are_taken_only_as_the_read_ends_of_pipes() {
        let argv = ["/bin/bash".to_string(), "-c".into(), "true".into()];
        let start = |dir: &Path| {
            let (_r1, w1) = rustix::pipe::pipe().unwrap();
            let (_r2, w2) = rustix::pipe::pipe().unwrap();
            let job = Job { argv: &argv, env: Vec::new(), cwd: None, next_env: Some(Vec::new()) };
            Remote::start(&Endpoint::in_dir(dir, false), job, &w1, &w2, None)
        };
        let pipe = || rustix::pipe::pipe().unwrap();
        let file = || OwnedFd::from(File::open("/dev/null").unwrap());
        let (socket, _peer) = UnixStream::pair().unwrap();
        let bad: Vec<Vec<OwnedFd>> = vec![
            Vec::new(),
            vec![pipe().0],
            vec![pipe().1, pipe().0],
            vec![file(), pipe().0],
            vec![OwnedFd::from(socket), pipe().0],
            vec![pipe().0, pipe().0, pipe().0],
        ];
        for fds in bad {
            let count = fds.len();
            let (dir, t) = fake_spawner(b"started 42 pipes\n", fds);
            let err = start(&dir).err().expect("a bad answer is refused");
            assert!(err.to_string().contains("without the command's output pipes"), "{count} fds: {err}");
            assert_eq!(t.join().unwrap(), "kill\n", "{count} fds: the command is stopped");
            let _ = std::fs::remove_dir_all(dir);
        }
        // Two read ends are the command's output; the pipe ends given go unused.
        let ((out_read, out_write), (err_read, err_write)) = (pipe(), pipe());
        let (dir, t) = fake_spawner(b"started 42 pipes\n", vec![out_read, err_read]);
        let (remote, pipes) = start(&dir).unwrap();
        assert_eq!(remote.pid(), Some(42));
        let [mut out, _err] = pipes.expect("the shell's pipes");
        File::from(out_write).write_all(b"from the shell").unwrap();
        drop(err_write);
        let mut got = [0u8; 14];
        out.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"from the shell");
        drop(remote);
        assert_eq!(t.join().unwrap(), "");
        // Descriptors with a plain `started` are not taken.
        let (dir2, t) = fake_spawner(b"started 43\n", vec![pipe().0, pipe().0]);
        let (remote, pipes) = start(&dir2).unwrap();
        assert!(pipes.is_none());
        drop(remote);
        t.join().unwrap();
        for d in [dir, dir2] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// A spawner that stops accepting (its backlog full) costs a caller its budget, not a blocked
    /// worker: before, the connect waited for as long as the spawner did.
    #[test]
    fn a_stalled_spawner_costs_the_connect_its_budget() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let dir = std::env::temp_dir().join(format!("smcp-stall-{}", crate::ids::random_hex(4)));
        std::fs::create_dir_all(&dir).unwrap();
        let to = Endpoint::in_dir(&dir, false);
        let _listener = UnixListener::bind(&to.socket).unwrap();
        let addr = SocketAddrUnix::new(&to.socket).unwrap();
        let mut held = Vec::new();
        for _ in 0..100_000 {
            let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, None)
                .unwrap();
            if rustix::net::connect(&fd, &addr).is_err() {
                break;
            }
            held.push(fd);
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let t = to.clone();
        std::thread::spawn(move || {
            let _ = tx.send(connect(&t, Duration::from_millis(200)).map(drop));
        });
        let got = rx.recv_timeout(Duration::from_secs(5)).expect("the connect to a stalled spawner did not give up");
        assert!(got.is_err(), "{got:?}");
        drop(held);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A request sent a byte at a time, or never sent, is given up at the deadline: before, each
    /// byte renewed the read timeout, so a sandbox of the same uid could hold a thread of another
    /// sandbox's spawner, and 4 MiB for it, for as long as it liked.
    #[test]
    fn a_trickled_request_is_given_up_at_its_deadline() {
        let (theirs, ours) = UnixStream::pair().unwrap();
        let trickle = std::thread::spawn(move || {
            let mut theirs = theirs;
            let _ = theirs.write_all(&(4u32 << 20).to_le_bytes());
            for _ in 0..100 {
                if theirs.write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let started = Instant::now();
        let got = receive(&ours, Instant::now() + Duration::from_millis(300), None, || true);
        assert!(got.is_err());
        assert!(started.elapsed() < Duration::from_millis(1500), "the trickle held the read for {:?}", started.elapsed());
        drop(ours);
        trickle.join().unwrap();
        let (_silent, ours) = UnixStream::pair().unwrap();
        let started = Instant::now();
        assert_eq!(
            receive(&ours, Instant::now() + Duration::from_millis(200), None, || true).err().map(|e| e.kind()),
            Some(io::ErrorKind::WouldBlock)
        );
        assert!(started.elapsed() < Duration::from_millis(1500));
    }

    /// A keyed spawner reads no further than the key's place: a request that does not open with
    /// the key is refused at once, however long it says it is and however long its sender stays,
    /// and one that does is read whole. (Before, the whole request was read first, for up to
    /// 10 s and 4 MiB, by any sandbox of the same uid.)
    #[test]
    fn a_request_that_does_not_open_with_the_key_is_refused_before_the_rest_is_read() {
        let key = crate::ids::random_hex(16);
        // The server's own request: the key first, as it serializes.
        let (theirs, ours) = UnixStream::pair().unwrap();
        let request = Request { key: Some(key.clone()), dial: Some(8000), ..Request::default() };
        (&theirs).write_all(&request.framed().unwrap()).unwrap();
        let mut proven = false;
        let Ok((got, fds)) = receive(&ours, Instant::now() + Duration::from_secs(5), Some(&key), || {
            proven = true;
            true
        }) else {
            panic!("the server's own request was refused")
        };
        assert!(proven && got.dial == Some(8000) && fds.is_none());
        // Another key, or the key last (any field first), or a claimed 4 MiB that never comes.
        let started = Instant::now();
        for opening in [format!(r#"{{"key":"{}""#, crate::ids::random_hex(16)), format!(r#"{{"dial":1,"key":"{key}""#)] {
            let (theirs, ours) = UnixStream::pair().unwrap();
            (&theirs).write_all(&[(4u32 << 20).to_le_bytes().as_slice(), opening.as_bytes()].concat()).unwrap();
            let mut proven = false;
            let Err(err) = receive(&ours, Instant::now() + Duration::from_secs(10), Some(&key), || {
                proven = true;
                true
            }) else {
                panic!("a request opening with {opening} was taken")
            };
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
            assert!(!proven);
        }
        assert!(started.elapsed() < Duration::from_secs(2), "the refusal waited {:?}", started.elapsed());
        // Silence is given up at the key's budget, not the request's.
        let (_silent, ours) = UnixStream::pair().unwrap();
        let started = Instant::now();
        assert!(receive(&ours, Instant::now() + Duration::from_secs(10), Some(&key), || true).is_err());
        assert!(started.elapsed() < KEY_BUDGET + Duration::from_secs(1), "{:?}", started.elapsed());
    }

    /// Connections that do not show the key cannot lock the server's own out: past
    /// `MAX_WAITING`, each new one pushes out the one that has waited longest, which is told
    /// `busy` and closed. (Before, the 33rd and every later connection was told `busy`, the
    /// server's among them.)
    #[test]
    fn a_flood_of_silent_connections_pushes_out_the_oldest_first() {
        let waiting = Waiting::default();
        let pairs: Vec<(UnixStream, UnixStream)> = (0..MAX_WAITING + 2).map(|_| UnixStream::pair().unwrap()).collect();
        let tickets: Vec<u64> = pairs.iter().map(|(_, ours)| waiting.admit(ours).unwrap()).collect();
        // What the other end reads: `busy` then the end, or nothing yet.
        let pushed_out = |theirs: &UnixStream| {
            theirs.set_nonblocking(true).unwrap();
            let mut got = Vec::new();
            let _ = (theirs as &UnixStream).read_to_end(&mut got);
            let ended = matches!((theirs as &UnixStream).read(&mut [0u8; 1]), Ok(0));
            assert_eq!(ended, got.starts_with(b"error busy: "), "{}", String::from_utf8_lossy(&got));
            ended
        };
        assert!(pushed_out(&pairs[0].0) && pushed_out(&pairs[1].0));
        assert!(pairs[2..].iter().all(|(theirs, _)| !pushed_out(theirs)));
        // One that passed no longer waits and is never pushed out.
        assert!(waiting.done(tickets[2]));
        let more: Vec<(UnixStream, UnixStream)> = (0..2).map(|_| UnixStream::pair().unwrap()).collect();
        for (_, ours) in &more {
            waiting.admit(ours).unwrap();
        }
        assert!(!pushed_out(&pairs[2].0) && pushed_out(&pairs[3].0) && !pushed_out(&pairs[4].0));
        assert!(more.iter().all(|(theirs, _)| !pushed_out(theirs)));
        assert_eq!(waiting.conns.lock().unwrap().len(), MAX_WAITING);
        assert!(!waiting.done(tickets[3]), "a pushed-out connection is not waiting any more");
    }

    /// A request pushed out after it was sent whole is not served: the shutdown leaves what was
    /// already sent readable, and the key in it would pass (found by a review: the command ran
    /// while the server was told the init was gone).
    #[test]
    fn a_request_pushed_out_after_it_was_sent_is_not_served() {
        let key = crate::ids::random_hex(16);
        let request = Request { key: Some(key.clone()), dial: Some(8000), ..Request::default() };
        for keyed in [true, false] {
            let waiting = Waiting::default();
            let (theirs, ours) = UnixStream::pair().unwrap();
            (&theirs).write_all(&request.framed().unwrap()).unwrap();
            let ticket = waiting.admit(&ours).unwrap();
            let newer: Vec<(UnixStream, UnixStream)> = (0..MAX_WAITING).map(|_| UnixStream::pair().unwrap()).collect();
            for (_, o) in &newer {
                waiting.admit(o).unwrap();
            }
            let got = receive(&ours, Instant::now() + Duration::from_secs(5), keyed.then_some(key.as_str()), || waiting.done(ticket));
            assert_eq!(got.err().map(|e| e.kind()), Some(io::ErrorKind::ConnectionAborted), "keyed {keyed}");
        }
    }

    /// What a taken-over init may answer a dial with: only a stream socket is taken; anything
    /// else, an error line or no answer, is an error that says what happened.
    #[test]
    fn a_dial_takes_only_a_stream_socket() {
        let (pipe_out, _pipe_in) = rustix::pipe::pipe().unwrap();
        let (dir, t) = fake_init(b"dialed\n", Some(pipe_out));
        let err = dial(&Endpoint::in_dir(&dir, false), 8000).unwrap_err();
        assert!(err.to_string().contains("not a stream socket"), "{err}");
        t.join().unwrap();
        let (dir2, t) = fake_init(b"error nothing listens on port 8000 inside the sandbox\n", None);
        let err = dial(&Endpoint::in_dir(&dir2, false), 8000).unwrap_err();
        assert_eq!(
            (err.kind(), err.to_string()),
            (io::ErrorKind::ConnectionRefused, "nothing listens on port 8000 inside the sandbox".to_string())
        );
        t.join().unwrap();
        // A taken-over init's words reach logs and answers without escapes or control bytes.
        let said = "error \x1b]0;owned\x07\x1b[2J\r\u{202e} text\u{9b}1m /srv/caf\u{e9} \u{5f20} \u{e0041}\u{e0042}\u{fe0f}\u{3164}\u{e000}\u{200b}";
        let (dir6, t) = fake_init([said.as_bytes(), b"\xff\n"].concat().leak(), None);
        let err = dial(&Endpoint::in_dir(&dir6, false), 8000).unwrap_err();
        assert_eq!(err.to_string(), "?]0;owned??[2J?? text?1m /srv/caf\u{e9} \u{5f20} ???????");
        t.join().unwrap();
        let _ = std::fs::remove_dir_all(dir6);
        let (dir3, t) = fake_init(b"dialed\n", None);
        assert!(dial(&Endpoint::in_dir(&dir3, false), 8000).unwrap_err().to_string().contains("not one"));
        t.join().unwrap();
        let (dir4, t) = fake_init(b"", None);
        assert_eq!(dial(&Endpoint::in_dir(&dir4, false), 8000).unwrap_err().kind(), io::ErrorKind::NotFound);
        t.join().unwrap();
        // A real connected socket is taken.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let inside = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (dir5, t) = fake_init(b"dialed\n", Some(OwnedFd::from(inside)));
        let mut got = dial(&Endpoint::in_dir(&dir5, false), 8000).unwrap();
        t.join().unwrap();
        got.write_all(b"hi").unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let mut buf = [0u8; 2];
        peer.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        for d in [dir, dir2, dir3, dir4, dir5] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// The init died while a `kill` of ours was still unread: the connection is reset, and the
    /// command counts as killed with the sandbox (it used to be an error, which a server shutting
    /// down reported as "the sandbox does not exist").
    #[test]
    fn a_reset_connection_is_the_commands_end() {
        let (ours, init) = UnixStream::pair().unwrap();
        let mut remote = Remote { conn: ours, pending: Vec::new(), ended: None, pid: None };
        assert!(remote.kill());
        drop(init);
        assert_eq!(remote.wait().unwrap(), Ended { code: KILLED_WITH_THE_SANDBOX, members_left: false });
    }

    /// A taken-over init that sends an endless line (or trickles one) costs its own call only:
    /// the read ends at [`MAX_LINE`] bytes or at the deadline, whichever comes first.
    #[test]
    fn an_endless_or_trickled_line_ends_the_read() {
        let (ours, mut init) = UnixStream::pair().unwrap();
        let flood = std::thread::spawn(move || while init.write_all(&[b'x'; 4096]).is_ok() {});
        let mut remote = Remote { conn: ours, pending: Vec::new(), ended: None, pid: None };
        let t0 = Instant::now();
        assert_eq!(remote.wait().unwrap(), Ended { code: KILLED_WITH_THE_SANDBOX, members_left: false });
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        drop(remote);
        flood.join().unwrap();
        let (ours, mut init) = UnixStream::pair().unwrap();
        let trickle = std::thread::spawn(move || {
            for _ in 0..40 {
                if init.write_all(b"e").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut remote = Remote { conn: ours, pending: Vec::new(), ended: None, pid: None };
        let t0 = Instant::now();
        let err = remote.wait_within(Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        drop(remote);
        trickle.join().unwrap();
    }

    #[test]
    fn end_lines() {
        assert_eq!(parse_end(Some("exit 3 0")), Ended { code: 3, members_left: false });
        assert_eq!(parse_end(Some("signal 15 1")), Ended { code: 143, members_left: true });
        assert_eq!(parse_end(None), Ended { code: KILLED_WITH_THE_SANDBOX, members_left: false });
        assert_eq!(parse_end(Some("nonsense")).code, KILLED_WITH_THE_SANDBOX);
    }
}
