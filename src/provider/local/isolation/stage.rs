//! The stage: the privileged first step of an isolated sandbox when the server runs as root (an
//! unprivileged server has util-linux `unshare` do the same, see [`super::init`]).
//!
//! In a mount namespace of its own the stage joins the sandbox's cgroups, binds the sandbox's
//! directory (or its disk) onto [`HANDOFF`] (the sandbox's uid may not be able to pass the
//! directories above it; [`hand_over`]), drops to the
//! sandbox's uid and gid without supplementary groups or capabilities, makes the sandbox's
//! namespaces (user, mapping root to that uid and gid alone; mount, private; pid; ipc; uts;
//! network unless the sandbox keeps the host's; cgroup where the kernel has it) and forks the
//! init, which runs in the child without an exec, as pid 1 of the new pid namespace. It waits
//! for the init and exits as it did (128 + N for signal N).
//!
//! The keeper forks the stage ([`fork_stage`]) while it runs on one thread, and the stage
//! rewrites the command line it inherited (the keeper's, which names the state root), which
//! sandbox code reads as `/proc/1/cmdline`. No program is executed from the keeper to the init:
//! each exec is about a millisecond of every create on the machine measured. Forked, the init's
//! memory is the keeper's copy, with the host's user namespace its owner: only a process with
//! `CAP_SYS_PTRACE` there may trace it or open its `/proc` files that need that right (`root`,
//! `fd`, `environ`, `mem`).
//!
//! `unsafe` is allowed in four functions here, each with its reason beside it: `fork` (of a
//! process of one thread, checked), `unshare` (rustix marks it unsafe for one flag, sharing no
//! descriptor table, never passed), SIGCHLD back to its default (neither std nor rustix wraps it
//! safely) and `close_range` of what the keeper held (or `close`, one at a time, on a kernel
//! without it).

use super::init::{self, sandbox_namespaces};
use std::io;
use std::os::unix::net::UnixStream;

/// Where the stage binds the home, in its private mount namespace.
pub const HANDOFF: &str = "/mnt";

/// What the stage does: for whom, in which cgroups, with which namespaces, what it hands over,
/// and the init's arguments.
pub(super) struct Stage {
    /// The host uid and gid of the sandbox's root.
    pub owner: (u32, u32),
    /// The `cgroup.procs` files the stage joins.
    pub cgroups: Vec<String>,
    /// Whether the sandbox gets a network namespace of its own.
    pub net: bool,
    /// The sandbox's home on the host.
    pub home: String,
    /// Whether the home is a file system of its own (a disk, [`super::disk`]): then it is bound
    /// as it is, since its mount names no host path anyway ([`hand_over`]).
    pub own_fs: bool,
    /// The init's arguments (after `sandbox-init`).
    pub init: Vec<String>,
}

/// Says `error MSG` on stdout (the keeper's answer socket); the error to return.
fn answer_error(msg: String) -> anyhow::Error {
    println!("error {msg}");
    anyhow::anyhow!(msg)
}

/// Whether this process runs on one thread (the child of a fork may run any code only then).
fn one_thread() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Runs `body` as the whole of a forked child's life and exits with its code: a panic is caught
/// here (exit status 101), so that it never unwinds into the frames the child shares with its
/// parent, whose objects hold descriptors the child has closed.
pub(crate) fn exit_child(body: impl FnOnce() -> i32) -> ! {
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
    std::process::exit(code)
}

/// Forks the stage of `stage` (the keeper must run on one thread: [`fork`]): its stdout
/// `answer`, its stderr a new pipe, whose read end is returned with the stage's pid; nothing else
/// the keeper holds stays open in it. Its command line becomes the init's (`sandbox-init ARGS`), its environment blank, as
/// sandbox code sees them in `/proc/1` ([`name_command_line`]).
pub(super) fn fork_stage(stage: Stage, answer: UnixStream) -> io::Result<(rustix::process::Pid, std::fs::File)> {
    let (err_read, err_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let null = std::fs::File::open("/dev/null")?;
    match fork()? {
        Some(pid) => Ok((pid, std::fs::File::from(err_read))),
        None => exit_child(move || {
            let set_up = rustix::stdio::dup2_stdin(&null)
                .and_then(|()| rustix::stdio::dup2_stdout(&answer))
                .and_then(|()| rustix::stdio::dup2_stderr(&err_write));
            drop((null, answer, err_write, err_read));
            close_from_3();
            let result = set_up
                .map_err(|e| answer_error(format!("cannot set up the stage's stdio: {e}")))
                .and_then(|()| {
                    let title: Vec<&str> = [init::SUBCOMMAND].into_iter().chain(stage.init.iter().map(String::as_str)).collect();
                    name_command_line(&title, Some(c"sandbox-init"), true)
                        .map_err(|e| answer_error(format!("cannot rewrite the init's command line: {e}")))
                })
                .and_then(|()| stage_and_init(stage));
            if let Err(err) = result {
                eprintln!("sandbox-mcp stage: {err:#}");
            }
            1
        }),
    }
}

/// The stage's work, then the init (see the module doc). Exits; returns only an error, which it
/// has answered (on stdout).
fn stage_and_init(stage: Stage) -> anyhow::Result<()> {
    use rustix::mount::MountPropagationFlags as Propagation;
    use rustix::thread::UnshareFlags as Ns;
    let fail = answer_error;
    let Stage { owner: (uid, gid), cgroups, net, home, own_fs, init: init_args } = stage;
    // As `unshare` did: the init must be able to wait for its children whatever the server was
    // started with.
    default_child_signal();
    // A mount namespace of its own for the handover, seen by nothing outside.
    unshare(Ns::NEWNS).map_err(|e| fail(format!("cannot make a mount namespace: {e}")))?;
    rustix::mount::mount_change("/", Propagation::PRIVATE | Propagation::REC)
        .map_err(|e| fail(format!("cannot make the mounts private: {e}")))?;
    // The first process of the sandbox: its cgroups before any namespace but this mount one.
    for file in &cgroups {
        std::fs::write(file, "0\n").map_err(|e| fail(format!("cannot join the sandbox's cgroup {file}: {e}")))?;
    }
    hand_over(std::path::Path::new(&home), own_fs, (uid, gid))
        .map_err(|e| fail(format!("cannot hand over the sandbox home {home}: {e}")))?;
    // One thread: these per-thread calls are the whole process's. From root to another uid the
    // kernel clears the permitted and effective capabilities; the inheritable ones go too.
    let (u, g) = (rustix::process::Uid::from_raw(uid), rustix::process::Gid::from_raw(gid));
    rustix::thread::set_thread_groups(&[]).map_err(|e| fail(format!("cannot drop the supplementary groups: {e}")))?;
    rustix::thread::set_thread_res_gid(g, g, g).map_err(|e| fail(format!("cannot take gid {gid}: {e}")))?;
    rustix::thread::set_thread_res_uid(u, u, u).map_err(|e| fail(format!("cannot take uid {uid}: {e}")))?;
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(None, rustix::thread::CapabilitySets { effective: none, permitted: none, inheritable: none })
        .map_err(|e| fail(format!("cannot drop the capabilities: {e}")))?;
    let namespaces = sandbox_namespaces(net, init::has_cgroup_namespace()).fold(Ns::empty(), |all, (ns, _)| all | ns);
    unshare(namespaces).map_err(|e| fail(format!("cannot make the sandbox's namespaces: {e}")))?;
    // Root inside is UID and GID outside, and nothing else is mapped (setgroups is denied first:
    // the kernel requires it of an unprivileged gid map). The uid change made this process
    // non-dumpable, which gives its /proc files to root: dumpable while it writes its own maps,
    // then not again (the init makes itself non-dumpable too).
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    set_dumpable_behavior(DumpableBehavior::Dumpable).map_err(|e| fail(format!("cannot become dumpable to write the id maps: {e}")))?;
    for (file, text) in [("setgroups", "deny".to_string()), ("gid_map", format!("0 {gid} 1")), ("uid_map", format!("0 {uid} 1"))] {
        std::fs::write(format!("/proc/self/{file}"), text).map_err(|e| fail(format!("cannot write /proc/self/{file}: {e}")))?;
    }
    set_dumpable_behavior(DumpableBehavior::NotDumpable).map_err(|e| fail(format!("cannot become non-dumpable again: {e}")))?;
    rustix::mount::mount_change("/", Propagation::PRIVATE | Propagation::REC)
        .map_err(|e| fail(format!("cannot make the sandbox's mounts private: {e}")))?;
    // The next child is pid 1 of the new pid namespace: this program's init, forked without an
    // exec.
    let Some(child) = fork().map_err(|e| fail(format!("cannot start the init: {e}")))? else {
        // The init: `run` returns only on a failed setup, which it has answered.
        exit_child(|| match init::run(&init_args) {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("sandbox-mcp {}: {err:#}", init::SUBCOMMAND);
                1
            }
        })
    };
    let status = init::Holder::of(child).wait().map_err(|e| anyhow::anyhow!("waiting for the init failed: {e}"))?;
    std::process::exit(crate::provider::process::status_code(status))
}

/// Where the init finds the sandbox home after the stage's [`hand_over`]: in the sandbox's
/// directory bound at [`HANDOFF`], or for a disk of the sandbox's own (`own_fs`) at [`HANDOFF`]
/// itself.
pub fn handed_over_home(own_fs: bool) -> String {
    if own_fs {
        HANDOFF.to_string()
    } else {
        format!("{HANDOFF}/{}", super::rootfs::LAYER_HOME)
    }
}

/// Hands the sandbox home over to the init, whose uid may not pass the directories above it: the
/// sandbox's directory bound at [`HANDOFF`], with the overlay's other layers made there for the
/// sandbox's uid and gid (`owner`) and the directory passable for its gid, so that the init
/// mounts the home's overlay itself, inside the sandbox's user namespace
/// ([`super::rootfs::mount_home`]). Mounted here, with the host root's credentials, which the
/// overlay keeps for writing its upper layer, the sandbox's writes would take what the host
/// keeps for root alone (ext4's reserved blocks, past disk quotas). A disk of the sandbox's own
/// (`own_fs`), whose mount names no host path, is bound as it is.
fn hand_over(home: &std::path::Path, own_fs: bool, (uid, gid): (u32, u32)) -> Result<(), String> {
    use super::rootfs::{make_layers, open_path, LAYER_LOWER, LAYER_WORK};
    use std::os::unix::fs::PermissionsExt;
    // Said here, at once, rather than by the init when it cannot open it.
    if !std::fs::metadata(home).map_err(|e| e.to_string())?.is_dir() {
        return Err("it is not a directory".into());
    }
    let dir = home.parent().filter(|_| !own_fs);
    let Some(dir) = dir else {
        return rustix::mount::mount_bind(home, HANDOFF).map_err(|e| e.to_string());
    };
    open_path(dir).and_then(|fd| make_layers(&fd)).map_err(|e| format!("make the overlay's layers in {}: {e}", dir.display()))?;
    for layer in [LAYER_LOWER, LAYER_WORK] {
        let path = dir.join(layer);
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).map_err(|e| format!("give {} to the sandbox: {e}", path.display()))?;
    }
    std::os::unix::fs::lchown(dir, None, Some(gid)).map_err(|e| format!("let the sandbox's gid pass {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710)).map_err(|e| format!("{}: {e}", dir.display()))?;
    rustix::mount::mount_bind(dir, HANDOFF).map_err(|e| e.to_string())
}

/// `fork(2)`: `None` in the child, the child's pid in the parent. Only for a process that runs on
/// one thread (the keeper as it starts, the stage); refused otherwise. A child that closes what
/// its parent held (the stage, the init) must end with [`exit_child`], never by returning into
/// the frames it shares with its parent; the keeper's `detach` has the parent exit instead.
#[allow(unsafe_code)]
pub(crate) fn fork() -> io::Result<Option<rustix::process::Pid>> {
    if !one_thread() {
        return Err(io::Error::other("this process runs more than one thread, so it cannot fork safely; report this"));
    }
    // SAFETY: this process runs on one thread (checked above; no thread starts meanwhile, as
    // nothing else runs), so the child may run any code after the fork, as a process started
    // afresh would (no lock is held by a thread that does not exist there).
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(rustix::process::Pid::from_raw(pid)),
    }
}

/// Closes every descriptor from 3 up: what the keeper held (its end of the answer socket, the
/// spawner's socket, files) must not live on in the sandbox's init, nor the keeper zygote's
/// request socket in a keeper it forks.
#[allow(unsafe_code)]
pub(crate) fn close_from_3() {
    // SAFETY: called in the forked stage (or keeper) before anything of its own is opened; the
    // descriptors closed belong to objects of the parent's frames, which this process never returns to (it
    // exits, a panic included: `exit_child`), so none is used or closed again.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if closed != 0 {
        // A kernel before 5.9: one at a time, up to the limit.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1024).min(1 << 20);
        for fd in 3..limit as i32 {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
        }
    }
}

/// Makes this process's command line, as `/proc/PID/cmdline` shows it (to sandbox code too, as
/// `/proc/1/cmdline` of the init forked from here), read `title` (arguments, each NUL-ended), as
/// much of it as the place of the arguments this process was started with holds (whole
/// arguments; NULs pad the rest), and with `blank_env` blanks the environment it was started
/// with (after which it has none). Both are written in place through `/proc/self/mem`: the stage's
/// are the keeper's, which named the state root, and no Rust object refers to that memory (std
/// copies its arguments when asked, and reads the environment there). Names the process
/// (`comm`) `comm` where given.
pub(crate) fn name_command_line(title: &[&str], comm: Option<&std::ffi::CStr>, blank_env: bool) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    // Fields 48 to 51 of the stat line (`arg_start`, `arg_end`, `env_start`, `env_end`); the
    // first after the name is field 3.
    let field = |n: usize| after_name.split_whitespace().nth(n - 3).and_then(|f| f.parse::<u64>().ok());
    let (Some(arg_start), Some(arg_end), Some(env_start), Some(env_end)) = (field(48), field(49), field(50), field(51)) else {
        return Err(io::Error::other("/proc/self/stat does not show where the arguments are"));
    };
    // (The kernel shows zeros to a reader it does not trust: fail rather than rewrite nothing.)
    if !(0 < arg_start && arg_start < arg_end && arg_end <= env_start && env_start <= env_end) {
        return Err(io::Error::other(format!(
            "/proc/self/stat shows no usable place for the arguments ({arg_start} {arg_end} {env_start} {env_end})"
        )));
    }
    let room = usize::try_from(arg_end.saturating_sub(arg_start)).map_err(io::Error::other)?;
    let mut args = Vec::with_capacity(room);
    for arg in title {
        if args.len() + arg.len() + 1 > room {
            break;
        }
        args.extend(arg.bytes().chain([0]));
    }
    args.resize(room, 0);
    let mem = std::fs::OpenOptions::new().write(true).open("/proc/self/mem")?;
    mem.write_all_at(&args, arg_start)?;
    if blank_env {
        let env = usize::try_from(env_end.saturating_sub(env_start)).map_err(io::Error::other)?;
        mem.write_all_at(&vec![0u8; env], env_start)?;
    }
    if let Some(comm) = comm {
        rustix::thread::set_name(comm)?;
    }
    Ok(())
}

/// `unshare(2)` of the calling process.
#[allow(unsafe_code)]
fn unshare(namespaces: rustix::thread::UnshareFlags) -> io::Result<()> {
    debug_assert!(!namespaces.contains(rustix::thread::UnshareFlags::FILES));
    // SAFETY: the call is unsafe only for `UnshareFlags::FILES` (threads would stop sharing their
    // descriptor table), which is never passed; the stage runs on one thread.
    unsafe { rustix::thread::unshare_unsafe(namespaces) }.map_err(io::Error::from)
}

/// SIGCHLD back to its default, as util-linux `unshare` sets it: an ignored SIGCHLD, inherited
/// from whatever started the server, would make every wait of the stage and of the init fail.
/// (Blocking signals here, as `unshare --fork` does in its waiting parent, would not do: the
/// mask passes to the init and on to every command, which then could not be stopped by SIGTERM.)
#[allow(unsafe_code)]
fn default_child_signal() {
    // SAFETY: one call in a process of one thread; SIG_DFL installs no handler.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
    }
}
