//! The init of an isolated sandbox: how the keeper starts it, and what it does as pid 1.
//!
//! The keeper runs `unshare` (namespaces, `--fork`) with this binary's `sandbox-init`
//! subcommand; the forked child is pid 1 of the new pid namespace, and its stdout a pipe to the
//! keeper. When the server runs as root, the sandbox's uid cannot reach the home inside the
//! private state root: a first, privileged step (`sandbox-stage`, in a mount namespace of its
//! own) binds the home onto [`HANDOFF`], drops to the sandbox's uid and only then creates the
//! user namespace. The init assembles the root filesystem, brings up the
//! loopback interface of a private network namespace, answers one line — `ready <host pid>
//! <start time>` or `error <what failed>` — and from then on serves the sandbox's spawner (commands
//! started on request, see [`spawner`](super::spawner)) and reaps orphans, forever: the sandbox
//! ends when something sends this init SIGKILL (no other signal reaches a pid-namespace init from
//! outside), and the kernel then ends every process inside.

use super::rootfs::{self, Plan};
use super::{spawner, Tools};
use crate::provider::process;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The namespaces every isolated sandbox gets (the network namespace is added unless the
/// sandbox asked for the host's network; the cgroup namespace where the kernel has one).
pub const UNSHARE_FLAGS: &[&str] =
    &["--user", "--map-root-user", "--mount", "--pid", "--fork", "--ipc", "--uts", "--propagation", "private"];

/// The subcommand of this binary that runs as the sandbox's init.
pub const SUBCOMMAND: &str = "sandbox-init";

/// The subcommand that hands the home over when the server runs as root (see the module doc).
pub const STAGE_SUBCOMMAND: &str = "sandbox-stage";

/// Where `sandbox-stage` binds the home, in its private mount namespace.
pub const HANDOFF: &str = "/mnt";

/// How long the keeper waits for the init's answer.
pub const START_BUDGET: Duration = Duration::from_secs(10);

/// A running init, as the keeper sees it.
pub struct Started {
    /// The init's pid in the keeper's pid namespace.
    pub pid: u32,
    /// Its start time (clock ticks since boot), which identifies it against pid reuse.
    pub start: u64,
    /// The `unshare` process that forked it (it waits for the init and reaps it).
    pub holder: Child,
}

/// Whether the kernel offers cgroup namespaces.
pub fn has_cgroup_namespace() -> bool {
    Path::new("/proc/self/ns/cgroup").exists()
}

/// Starts the init of a sandbox whose home is `home`, with a private network unless
/// `host_network`, and waits for its answer. With `spawner`, the init serves spawn requests on
/// that listening socket (handed over as its stdin).
pub fn start(
    tools: &Tools,
    exe: &Path,
    home: &Path,
    host_network: bool,
    shell: &Path,
    spawner: Option<UnixListener>,
) -> Result<Started, String> {
    let as_root = rustix::process::getuid().is_root();
    let mut cmd = if as_root {
        let mut c = Command::new(&tools.unshare);
        c.args(["--mount", "--propagation", "private", "--"]).arg(exe).arg(STAGE_SUBCOMMAND).arg(home).arg("--");
        let dropped = super::sandbox_command(tools, &tools.unshare);
        c.arg(dropped.get_program()).args(dropped.get_args());
        c
    } else {
        super::sandbox_command(tools, &tools.unshare)
    };
    cmd.args(UNSHARE_FLAGS);
    if !host_network {
        cmd.arg("--net");
    }
    if has_cgroup_namespace() {
        cmd.arg("--cgroup");
    }
    cmd.arg("--").arg(exe).arg(SUBCOMMAND).arg("--home").arg(if as_root { Path::new(HANDOFF) } else { home });
    if !super::visible_inside(shell) {
        cmd.arg("--bind-file").arg(shell);
    }
    if !host_network {
        cmd.arg("--loopback");
    }
    let stdin = match spawner {
        Some(listener) => {
            cmd.arg(SPAWNER_FLAG);
            Stdio::from(std::os::fd::OwnedFd::from(listener))
        }
        None => Stdio::null(),
    };
    let mut holder = cmd
        .env_clear()
        .env("LC_ALL", "C")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", tools.unshare.display()))?;
    let Some(stdout) = holder.stdout.take() else {
        return Err("the init's answer pipe is missing".into());
    };
    let answer = read_line_within(stdout, START_BUDGET);
    let parsed = answer.as_deref().and_then(|line| {
        let mut it = line.split_whitespace();
        match (it.next(), it.next().and_then(|p| p.parse().ok()), it.next().and_then(|s| s.parse().ok())) {
            (Some("ready"), Some(pid), Some(start)) => Some((pid, start)),
            _ => None,
        }
    });
    match parsed {
        Some((pid, start)) => Ok(Started { pid, start, holder }),
        None => {
            // Whatever it got to, the namespaces end with the init; the holder follows.
            if let Some(pid) = child_of(holder.id()) {
                let _ = process::signal_pids(Path::new("/bin/sh"), "KILL", &[pid]);
            }
            let _ = holder.kill();
            let _ = holder.wait();
            Err(match answer {
                Some(line) => line.strip_prefix("error ").unwrap_or(&line).to_string(),
                None => format!("the sandbox's init did not answer within {} s", START_BUDGET.as_secs()),
            })
        }
    }
}

/// Reads one line from `pipe`, or `None` at end of file or when `budget` passes (the answers of
/// a starting init and of a starting keeper).
pub(crate) fn read_line_within(pipe: impl io::Read + Send + 'static, budget: Duration) -> Option<String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new().name("sandbox-mcp-answer".into()).spawn(move || {
        let mut line = String::new();
        let ok = BufReader::new(pipe).read_line(&mut line).is_ok_and(|n| n > 0);
        let _ = tx.send(ok.then(|| line.trim_end().to_string()));
    });
    spawned.ok()?;
    rx.recv_timeout(budget).ok().flatten()
}

/// The first child of process `pid` (the init forked by `unshare`), from `/proc`.
fn child_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The body of `sandbox-mcp sandbox-stage HOME -- PROGRAM ARGS...` (root only): binds HOME onto
/// [`HANDOFF`] in this process's private mount namespace, then becomes PROGRAM.
pub fn run_stage(args: &[String]) -> anyhow::Result<()> {
    let [home, dash, program, rest @ ..] = args else {
        anyhow::bail!("usage: sandbox-stage HOME -- PROGRAM ARGS...");
    };
    anyhow::ensure!(dash == "--", "usage: sandbox-stage HOME -- PROGRAM ARGS...");
    rustix::mount::mount_bind(home.as_str(), HANDOFF).map_err(|e| {
        let msg = format!("error cannot hand over the sandbox home {home}: {e}");
        println!("{msg}");
        anyhow::anyhow!(msg)
    })?;
    let err = std::os::unix::process::CommandExt::exec(Command::new(program).args(rest));
    println!("error cannot run {program}: {err}");
    Err(err.into())
}

/// The flag that tells the init its stdin is the spawner's listening socket.
const SPAWNER_FLAG: &str = "--spawner";

/// The body of `sandbox-mcp sandbox-init --home PATH [--bind-file PATH] [--loopback]
/// [--spawner]`, pid 1 of a new pid namespace. Returns only on a setup failure (after answering
/// `error ...`).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut extra_file = None;
    let mut home = None;
    let mut loopback = false;
    let mut serve = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--home" => home = it.next().map(PathBuf::from),
            "--bind-file" => extra_file = it.next().map(PathBuf::from),
            "--loopback" => loopback = true,
            SPAWNER_FLAG => serve = true,
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let Some(home) = home else { anyhow::bail!("sandbox-init needs --home PATH") };
    let identity = host_identity();
    let plan = Plan { home, extra_file };
    let setup = identity.and_then(|id| {
        rootfs::assemble(&plan)?;
        if loopback {
            loopback_up().map_err(|e| format!("bring up the loopback interface: {e}"))?;
        }
        Ok(id)
    });
    let mut out = io::stdout().lock();
    let (pid, start) = match setup {
        Ok(id) => id,
        Err(err) => {
            let _ = writeln!(out, "error {}", err.replace('\n', " "));
            let _ = out.flush();
            anyhow::bail!("{err}");
        }
    };
    // The listening socket moves off stdin, closed on exec so that no command inherits it.
    let listener = if serve { Some(UnixListener::from(rustix::io::fcntl_dupfd_cloexec(io::stdin(), 3)?)) } else { None };
    writeln!(out, "ready {pid} {start}")?;
    out.flush()?;
    drop(out);
    // Let go of the keeper's pipe.
    let null = File::options().read(true).write(true).open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    match listener {
        Some(listener) => spawner::serve(listener),
        None => reap_forever(),
    }
}

/// This process's pid and start time as the keeper sees them, read from the host's `/proc`
/// before it is replaced (its `self` link names the pid in the mounting pid namespace).
fn host_identity() -> Result<(u32, u64), String> {
    let link = std::fs::read_link("/proc/self").map_err(|e| format!("read /proc/self: {e}"))?;
    let pid: u32 = link.to_string_lossy().parse().map_err(|_| format!("unexpected /proc/self link {}", link.display()))?;
    let st = process::proc_stat(pid).ok_or_else(|| format!("cannot read /proc/{pid}/stat"))?;
    Ok((pid, st.start))
}

/// Waits for every child, forever. With none to wait for, it naps briefly: an orphan adopted
/// meanwhile is reaped on the next round, well within a second of its exit.
fn reap_forever() -> ! {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Sets `lo` up in the sandbox's network namespace through one rtnetlink request (ifindex 1 is
/// the loopback interface of every new network namespace).
fn loopback_up() -> io::Result<()> {
    use rustix::net::{recv, send, socket, AddressFamily, RecvFlags, SendFlags, SocketType};
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const IFF_UP: u32 = 1;
    // Protocol 0 of the netlink family is NETLINK_ROUTE.
    let fd = socket(AddressFamily::NETLINK, SocketType::RAW, None).map_err(io::Error::from)?;
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it in
    msg.extend_from_slice(&[0, 0]); // ifi_family AF_UNSPEC, padding
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&1i32.to_ne_bytes()); // ifi_index: lo
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    send(&fd, &msg, SendFlags::empty()).map_err(io::Error::from)?;
    let mut reply = [0u8; 256];
    let (n, _) = recv(&fd, &mut reply, RecvFlags::empty()).map_err(io::Error::from)?;
    // An NLMSG_ERROR (type 2) answer carries the errno (0 for the acknowledgement) after the header.
    if n >= 20 && u16::from_ne_bytes([reply[4], reply[5]]) == 2 {
        let errno = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(-errno));
        }
    }
    Ok(())
}
