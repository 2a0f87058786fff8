//! The spawner of a Landlock-tier sandbox: one process per sandbox, kept by its keeper, that
//! starts every command of the sandbox on the server's request (the protocol of [`spawner`],
//! which the init of an isolated sandbox serves too).
//!
//! It confines itself once its setup is done (the sandbox's cgroups, its own uid when it has
//! one, `no_new_privs`, the Landlock ruleset, seccomp), so its children are all in one Landlock
//! domain: the ruleset can then scope signals to the sandbox (ABI 6), since a task,
//! `cancel_task`'s snippet and a `kill` in run_command all share that domain, while the server,
//! the host user's processes and other sandboxes are outside it. It also spares each command a
//! fork of the server. It is a child subreaper, so whatever a command leaves behind stays
//! beneath it and is reaped there, and not dumpable: nothing of the sandbox may trace it.
//!
//! Under a root server it starts in a network namespace of its own (`unshare --net`), where it
//! brings up the loopback interface and binds the egress proxy's port, whose listening socket it
//! sends to the keeper (which serves the proxy, as for the namespace tier) before it confines
//! itself. Its commands then have no route anywhere but that proxy, and the ruleset lets them
//! connect to its port only. The keeper keeps the namespace (a descriptor of it), so that a
//! spawner started again joins it (`setns`, the descriptor sent on its answer socket).
//!
//! Where its uid cannot pass a directory above its home, it also starts in a mount namespace of
//! its own (`unshare --mount`), where it opens a [`passage`](super::passage) to the home before it
//! takes that uid.
//!
//! Every spawner answers the keeper on its stderr, a socket: `ready`, or `error <what failed>`,
//! which the keeper records (`spawner.error`) for the server to pass on to the call that waited.
//!
//! The server binds the socket ([`spawner::SOCKET_FILE`] in the sandbox's directory) when it
//! creates the sandbox and hands the listening socket to the keeper as its stdout; a connection
//! made before the spawner runs waits in the socket's backlog. The keeper passes it on as the
//! spawner's stdout, records the spawner (`spawner.pid`), and starts another one when it ends
//! (sandbox code can kill it: it runs as the sandbox). A keeper restarted by a sweep binds the
//! socket again once the spawner it did not start has ended. The spawner is executed through a
//! descriptor of this binary opened by the keeper, as the init is.

use super::enter::Init;
use super::{init, landlock, spawner, Tools};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The subcommand of this binary that runs as a Landlock-tier sandbox's spawner.
pub const SUBCOMMAND: &str = "sandbox-landlock-spawner";

/// The file in a sandbox's directory that names its spawner: `<pid> <start time>`.
pub const RECORD: &str = "spawner.pid";

/// The least time between two starts of a sandbox's spawner.
const RESTART_EVERY: Duration = Duration::from_secs(1);

/// Where a sandbox's spawner runs and what it is confined to.
pub struct Site<'a> {
    /// The sandbox's id (its processes carry it in their environment, as every command does).
    pub id: &'a str,
    /// The sandbox's home, the spawner's working directory.
    pub home: &'a Path,
    /// Its own temporary directory.
    pub tmp: &'a Path,
    /// The server's shell.
    pub shell: &'a Path,
    /// This program.
    pub exe: &'a Path,
    /// The `cgroup.procs` files of the sandbox's limits.
    pub cgroups: &'a [PathBuf],
    /// The sandbox's own uid, if it has one.
    pub uid: Option<u32>,
    /// The programs that make a network namespace of its own (a root server's sandbox, whose
    /// egress goes through its proxy); `None` keeps the host's network stack, where the
    /// ruleset allows no TCP at all.
    pub net: Option<&'a Tools>,
    /// The programs that make a mount namespace of its own, when the sandbox has a uid of its own
    /// that cannot pass a directory above its home (see [`passage`](super::passage)).
    pub passage: Option<&'a Tools>,
}

/// A keeper's hold on its sandbox's spawner.
pub struct Keeping {
    dir: PathBuf,
    listener: Option<UnixListener>,
    child: Option<Child>,
    last_start: Option<Instant>,
    /// The sandbox's network namespace, once a spawner made it.
    netns: Option<File>,
}

impl Keeping {
    /// Keeps the spawner of the sandbox in `dir`, serving `listener` (the socket the server
    /// bound), or, without it (a keeper restarted by a sweep), a socket bound again once no
    /// spawner runs.
    pub fn new(dir: &Path, listener: Option<UnixListener>) -> Keeping {
        Keeping { dir: dir.to_path_buf(), listener, child: None, last_start: None, netns: None }
    }

    /// Starts the spawner when none runs (at most once per [`RESTART_EVERY`]); reaps one that
    /// ended. Returns the egress proxy's listening socket when a spawner made the sandbox's
    /// network namespace (the keeper serves the proxy on it), and says why when it could not
    /// start one.
    pub fn tend(&mut self, site: &Site<'_>) -> Result<Option<std::net::TcpListener>, String> {
        if !self.dir.join("meta.json").exists() {
            // Being killed: nothing starts again.
            return Ok(None);
        }
        if let Some(child) = self.child.as_mut() {
            match child.try_wait() {
                Ok(None) => return Ok(None),
                Ok(Some(_)) | Err(_) => self.child = None,
            }
        } else if Init::read(&self.dir.join(RECORD)).is_some_and(|spawner| spawner.alive()) {
            // Started by a keeper before this one: it serves the socket as long as it lives.
            return Ok(None);
        }
        if self.last_start.is_some_and(|at| at.elapsed() < RESTART_EVERY) {
            return Ok(None);
        }
        self.last_start = Some(Instant::now());
        if self.listener.is_none() {
            self.listener = spawner::bind(&self.dir);
        }
        let listener = self.listener.as_ref().ok_or("could not bind the spawner's socket")?;
        let (child, egress) = match start(listener, site, self.netns.as_ref()) {
            Ok(started) => {
                let _ = std::fs::remove_file(self.dir.join(FAILURE));
                started
            }
            Err(why) => {
                // For the server to tell a caller whose command waits for a spawner that failed.
                let why: String = why.chars().take(MAX_FAILURE / 2).collect();
                let _ = std::fs::write(self.dir.join(FAILURE), &why);
                return Err(why);
            }
        };
        let pid = child.id();
        let record = Init { pid, start: crate::provider::process::proc_stat(pid).map(|st| st.start).unwrap_or(0) };
        self.child = Some(child);
        if egress.is_some() {
            // Opened while the spawner lives in it (it answered, so it has not ended yet).
            self.netns = Some(File::open(format!("/proc/{pid}/ns/net")).map_err(|e| format!("could not hold the sandbox's network: {e}"))?);
        }
        record.store_as(&self.dir, RECORD).map_err(|e| format!("could not record the spawner: {e}"))?;
        Ok(egress)
    }
}

/// Starts the spawner of `site` on `listener`, in network namespace `netns` when given, else
/// in a new one when the site has a network of its own; returns the new namespace's egress
/// listening socket too.
fn start(listener: &UnixListener, site: &Site<'_>, netns: Option<&File>) -> Result<(Child, Option<std::net::TcpListener>), String> {
    // Opened with the keeper's rights: the sandbox's uid needs no path to this binary.
    let exe = rustix::fs::open(site.exe, rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| format!("could not open this program ({}) to start the sandbox's spawner: {e}", site.exe.display()))?;
    // The spawner answers on its stderr: ready or the error, and its egress socket if it made one;
    // a spawner started again gets the namespace to join over it first.
    let (answer, theirs) = UnixStream::pair().map_err(|e| format!("could not make the spawner's answer socket: {e}"))?;
    let fresh_network = site.net.is_some() && netns.is_none();
    let mut namespaces = Vec::new();
    if fresh_network {
        namespaces.push("--net");
    }
    if site.passage.is_some() {
        namespaces.extend(["--mount", "--propagation", "private"]);
    }
    let mut cmd = match site.net.filter(|_| fresh_network).or(site.passage) {
        Some(tools) => {
            let mut c = Command::new(&tools.unshare);
            c.args(namespaces).args(["--", init::EXE_FROM_STDIN]);
            c
        }
        None => Command::new(init::EXE_FROM_STDIN),
    };
    cmd.arg(SUBCOMMAND).arg(site.home).arg(site.tmp).arg(site.shell);
    if site.passage.is_some() {
        cmd.arg(PASSAGE_FLAG);
    }
    if let Some(uid) = site.uid {
        cmd.arg(format!("--uid={uid}"));
    }
    for file in site.cgroups {
        cmd.arg("--cgroup").arg(file);
    }
    match (site.net.is_some(), netns.is_some()) {
        (true, false) => cmd.arg(EGRESS_FLAG),
        (true, true) => cmd.arg(JOIN_FLAG),
        (false, _) => cmd.arg(ANSWER_FLAG),
    };
    let socket = listener.try_clone().map_err(|e| format!("could not pass the spawner's socket: {e}"))?;
    cmd.current_dir(site.home)
        .env_clear()
        .env(super::super::TAG_VAR, site.id)
        .env("LC_ALL", "C")
        .stdin(Stdio::from(exe))
        .stdout(Stdio::from(OwnedFd::from(socket)))
        .stderr(Stdio::from(OwnedFd::from(theirs)));
    let mut child = cmd.spawn().map_err(|e| format!("could not start the sandbox's spawner: {e}"))?;
    // The command holds our copy of the answer socket's other end until dropped.
    drop(cmd);
    if let (Some(_), Some(netns)) = (site.net, netns) {
        if let Err(e) = init::send_fd(&answer, netns) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("could not pass the sandbox's network: {e}"));
        }
    }
    match init::read_answer(&answer, init::START_BUDGET) {
        (init::Answer::Line(line), Some(fd)) if line == "ready" && fresh_network => Ok((child, Some(std::net::TcpListener::from(fd)))),
        (init::Answer::Line(line), None) if line == "ready" && !fresh_network => Ok((child, None)),
        (said, _) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(match said {
                init::Answer::Line(line) => line.strip_prefix("error ").unwrap_or(&line).to_string(),
                _ => "the sandbox's spawner ended before it was ready".to_string(),
            })
        }
    }
}

/// Why the last start of the spawner of the sandbox in `dir` failed, if it did (a few hundred
/// characters at most, as the keeper recorded it).
pub fn last_failure(dir: &Path) -> Option<String> {
    let text = std::fs::read(dir.join(FAILURE)).ok()?;
    let text = String::from_utf8_lossy(&text[..text.len().min(MAX_FAILURE)]).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// The file in a sandbox's directory where its keeper records why the spawner could not start.
const FAILURE: &str = "spawner.error";

/// The longest failure recorded.
const MAX_FAILURE: usize = 600;

/// The spawner's flag: make the network namespace's loopback and egress socket (it was just
/// made: its stderr is the answer socket).
const EGRESS_FLAG: &str = "--egress";

/// The spawner's flag: join the sandbox's network namespace, whose descriptor comes first on the
/// answer socket (a spawner started again); its commands may connect to the egress proxy's port.
const JOIN_FLAG: &str = "--join-net";

/// The spawner's flag: it runs in a mount namespace of its own, where it opens a passage to its
/// home before it takes the sandbox's uid.
const PASSAGE_FLAG: &str = "--passage";

/// The spawner's flag: its stderr is the answer socket (`ready` or `error ...`), without a
/// network of its own.
const ANSWER_FLAG: &str = "--answer";

/// The body of `sandbox-mcp sandbox-landlock-spawner HOME TMP SHELL [--uid=N] [--cgroup FILE]...
/// [--passage] [--egress | --join-net | --answer]`: its stdout is the listening socket, its working directory the
/// sandbox's home. Returns only on a setup failure.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    // A session of its own: no controlling terminal for it or anything it starts.
    rustix::process::setsid()?;
    let listener = UnixListener::from(io::stdout().as_fd().try_clone_to_owned()?);
    let answer = io::stderr().as_fd().try_clone_to_owned()?;
    let ready = setup(args, &answer);
    let answers = args.iter().any(|a| a == EGRESS_FLAG || a == ANSWER_FLAG || a == JOIN_FLAG);
    let key = match ready {
        Ok((Some(egress), key)) => {
            super::fd_passing::send_with_fds(&answer, b"ready\n", &[egress.as_fd()])?;
            key
        }
        Ok((None, key)) => {
            if answers {
                rustix::io::write(&answer, b"ready\n")?;
            }
            key
        }
        Err(err) => {
            if answers {
                let _ = rustix::io::write(&answer, format!("error {}\n", err.replace('\n', " ")).as_bytes());
            }
            anyhow::bail!("{err}");
        }
    };
    drop(answer);
    // Let go of this binary (stdin), the keeper's copy of the socket (stdout) and its answer
    // socket or network namespace (stderr).
    let null = File::options().read(true).write(true).open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    let home = std::env::current_dir()?;
    spawner::serve(listener, home, key)
}

/// Gives up every capability of uid 0 for good, for this process and everything it starts: a
/// root server's sandbox that cannot have a uid of its own (the server is root of a user
/// namespace that maps no other uid) keeps uid 0, which must not mean rebooting the host,
/// setting its clock or driving I/O ports. Secure bits first (so that no exec as uid 0 gives
/// capabilities back), then the bounding set, then the sets themselves.
fn give_up_root() -> Result<(), String> {
    use rustix::thread::{CapabilitiesSecureBits as Bits, CapabilitySet, CapabilitySets};
    let bits = Bits::NO_ROOT
        | Bits::NO_ROOT_LOCKED
        | Bits::NO_SETUID_FIXUP
        | Bits::NO_SETUID_FIXUP_LOCKED
        | Bits::NO_CAP_AMBIENT_RAISE
        | Bits::NO_CAP_AMBIENT_RAISE_LOCKED;
    rustix::thread::set_capabilities_secure_bits(bits).map_err(|e| format!("lock the secure bits: {e}"))?;
    // CAP_SETPCAP, which the removal needs, goes last.
    let all = CapabilitySet::all().iter().filter(|c| *c != CapabilitySet::SETPCAP).chain([CapabilitySet::SETPCAP]);
    for cap in all {
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            // A capability this kernel does not know.
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(format!("drop {cap:?} from the bounding set: {e}")),
        }
    }
    let none = CapabilitySet::empty();
    rustix::thread::set_capabilities(None, CapabilitySets { effective: none, permitted: none, inheritable: none })
        .map_err(|e| format!("drop the capabilities: {e}"))
}

/// The spawner's setup, up to its confinement: the egress socket when it makes the network, and
/// the key its requests must carry (read beside the sandbox's home, before the ruleset hides it).
fn setup(args: &[String], answer: &OwnedFd) -> Result<(Option<OwnedFd>, Option<String>), String> {
    let [home, tmp, shell, flags @ ..] = args else {
        return Err(format!(
            "usage: {SUBCOMMAND} HOME TMP SHELL [--uid=N] [--cgroup FILE]... [{PASSAGE_FLAG}] [{EGRESS_FLAG} | {JOIN_FLAG} | {ANSWER_FLAG}]"
        ));
    };
    let (mut uid, mut cgroups, mut egress, mut proxy, mut passage) = (None, Vec::new(), false, false, false);
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--cgroup" => cgroups.push(PathBuf::from(it.next().ok_or("--cgroup needs a file")?)),
            EGRESS_FLAG => egress = true,
            JOIN_FLAG => {
                let netns = init::receive_fd(answer).map_err(|e| format!("receive the sandbox's network: {e}"))?;
                rustix::thread::move_into_link_name_space(netns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
                    .map_err(|e| format!("join the sandbox's network: {e}"))?;
                proxy = true;
            }
            ANSWER_FLAG => {}
            PASSAGE_FLAG => passage = true,
            other => match other.strip_prefix("--uid=").and_then(|n| n.parse::<u32>().ok()) {
                Some(n) => uid = Some(n),
                None => return Err(format!("unknown argument {other:?}")),
            },
        }
    }
    let egress = if egress {
        init::loopback_up().map_err(|e| format!("bring up the loopback interface: {e}"))?;
        let port = crate::egress::PROXY_PORT;
        let socket = std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("bind the egress proxy's port {port}: {e}"))?;
        Some(OwnedFd::from(socket))
    } else {
        None
    };
    // Without its key, any process of the same uid could have it start commands: refuse to
    // serve. Read before the passage covers the sandbox's directory.
    let key = Path::new(home).parent().and_then(spawner::read_key).ok_or("the sandbox's spawner key is missing or unreadable")?;
    if passage {
        super::passage::open(Path::new(home), Path::new(tmp))?;
    }
    let plan = landlock::Plan {
        home: Path::new(home),
        tmp: Path::new(tmp),
        shell: Path::new(shell),
        scope_signals: true,
        connect_port: (egress.is_some() || proxy).then_some(crate::egress::PROXY_PORT),
        cgroups: &cgroups,
        terminals: uid.is_some(),
    };
    // Built with the keeper's rights, before they are dropped.
    let confinement = landlock::prepare(&plan)?;
    if let Some(uid) = uid {
        let (u, g) = (rustix::process::Uid::from_raw(uid), rustix::process::Gid::from_raw(uid));
        rustix::thread::set_thread_groups(&[]).map_err(|e| format!("drop supplementary groups: {e}"))?;
        rustix::thread::set_thread_res_gid(g, g, g).map_err(|e| format!("take gid {uid}: {e}"))?;
        rustix::thread::set_thread_res_uid(u, u, u).map_err(|e| format!("take uid {uid}: {e}"))?;
    }
    if uid.is_none() && rustix::process::geteuid().is_root() {
        give_up_root()?;
    }
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable).map_err(|e| format!("be not dumpable: {e}"))?;
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(|e| format!("be a subreaper: {e}"))?;
    // This process has one thread: the ruleset and the filter hold for all of it.
    landlock::confine_self(&confinement).map_err(|e| format!("confine the spawner: {e}"))?;
    Ok((egress, Some(key)))
}
