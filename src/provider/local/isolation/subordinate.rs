//! Subordinate ids: the user namespace an unprivileged server enters at start so that each of its
//! isolated sandboxes gets a host uid of its own, as under a root server.
//!
//! A user with ranges in `/etc/subuid` and `/etc/subgid` may map them, through the set-uid
//! helpers `newuidmap` and `newgidmap`, into a user namespace it owns. The server's namespace maps
//! its own uid and gid to 0 and ids `1..=count` to the first `count` subordinate ids (at most
//! [`MAX_IDS`]); inside it the server is root, and the root server's code paths apply: each
//! sandbox gets one id of `1..count` (mapped to a subordinate id on the host, see
//! [`super::uids`]), the probe runs as id `count`. The server hands its keepers [`MARKER`], so
//! they know it too ([`entered`]).
//!
//! Every server process of a state root must be in the same user namespace as the sandboxes it
//! serves: a process in another namespace made from the host's has no rights over them at all,
//! and one in the host's namespace (which owns the namespace) may signal them but not read or
//! write their files. So a starting server, under the state root's lock, looks at the state root's live
//! processes: its servers (each records itself in [`MEMBERS`]), and its sandboxes' keepers, inits
//! (whose own namespace is a child of the one that made them) and Landlock spawners.
//! - Where one lives in the host's namespace (sandboxes made sharing the server's uid, or a
//!   server that stayed there), it stays there too.
//! - Else, where one lives in a namespace this user made from the host's, it joins that one,
//!   whether or not `--subordinate-ids` asks for subordinate ids: reaching the state root's
//!   sandboxes comes first.
//! - Else, when asked, it makes a new one (with the same maps it gives the same host ids, so
//!   files left by earlier ones stay readable).
//!
//! Joining or making happens before the process has a second thread, as `setns` demands. Where
//! any step fails, the server stays where it was and its sandboxes share its uid, as without
//! subordinate ids; the log says why.

use super::enter::Init;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The most subordinate ids a server maps (as many sandboxes as it may hold, and the probe).
pub const MAX_IDS: u32 = 65_536;

/// How long making a namespace may take (the helper's start and both set-uid helpers).
const BUDGET: Duration = Duration::from_secs(5);

/// How long a starting server waits for another one holding the state root's lock.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The state root's directory of its live servers, one record (`<pid> <start time>`) per
/// server, named by its pid namespace and its pid ([`record_prefix`]).
const MEMBERS: &str = "userns-members";

/// The lock a starting server holds while it decides which namespace to enter.
const LOCK: &str = "userns.lock";

/// The namespace for subordinate ids this process runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entered {
    /// Ids `1..=count` inside are subordinate ids on the host.
    pub count: u32,
    /// The server's host uid (0 inside).
    pub host_uid: u32,
    /// The host uid that id 1 inside maps to.
    pub first_host_uid: u32,
}

impl Entered {
    /// The ids inside the namespace each sandbox gets one of (`1..count`).
    pub fn sandbox_ids(&self) -> (u32, u32) {
        (1, self.count - 1)
    }

    /// The id inside the namespace the isolation probe runs as (no sandbox's).
    pub fn probe_id(&self) -> u32 {
        self.count
    }

    /// The host uid of id `uid` inside.
    pub fn host_id(&self, uid: u32) -> u64 {
        match uid {
            0 => u64::from(self.host_uid),
            n => u64::from(self.first_host_uid) + u64::from(n) - 1,
        }
    }
}

static ENTERED: OnceLock<Option<Entered>> = OnceLock::new();

/// The environment variable a server in a namespace for subordinate ids hands its keepers (which
/// start with an environment of the server's choosing), so that they know it too. A map of the
/// same shape alone says nothing: rootless containers map their root the same way.
pub const MARKER: &str = "SANDBOX_MCP_SUBORDINATE_NAMESPACE";

/// The namespace for subordinate ids this process runs in, if it does: the one [`enter`] put the
/// server in, or, in a process the server started with [`MARKER`] set, the one its own uid map
/// describes (0 mapped to one host uid and `1..=count` to a range).
pub fn entered() -> Option<&'static Entered> {
    ENTERED
        .get_or_init(|| handed(std::env::var_os(MARKER).is_some(), &fs::read_to_string("/proc/self/uid_map").unwrap_or_default()))
        .as_ref()
}

/// The namespace a process started by a server sees itself in: only with the server's
/// [`MARKER`] (`marked`), the one its uid map describes.
fn handed(marked: bool, uid_map: &str) -> Option<Entered> {
    marked.then(|| from_map(uid_map)).flatten()
}

/// The namespace a `uid_map` text describes, when it has the shape [`enter`] makes.
fn from_map(text: &str) -> Option<Entered> {
    let lines: Vec<Vec<u32>> = text.lines().map(|l| l.split_whitespace().filter_map(|n| n.parse().ok()).collect()).collect();
    match lines.as_slice() {
        [own, range] if own.as_slice() == [0, own.get(1).copied()?, 1] && range.len() == 3 && range[0] == 1 && range[2] >= 2 => {
            Some(Entered { count: range[2], host_uid: own[1], first_host_uid: range[1] })
        }
        _ => None,
    }
}

/// Whether this process is root of the host's own user namespace (not root of a namespace for
/// subordinate ids, which cannot mount block devices or write the host's cgroups).
pub fn host_root() -> bool {
    rustix::process::geteuid().is_root() && entered().is_none()
}

/// This process's uid on the host.
pub fn host_uid() -> u64 {
    let uid = rustix::process::getuid().as_raw();
    entered().map_or(u64::from(uid), |e| e.host_id(uid))
}

/// One `/etc/subuid` or `/etc/subgid` range: first host id and count.
type Range = (u32, u32);

/// What a server with `uid` (named `name`) and `gid` would map, from the text of
/// `/etc/subuid` and `/etc/subgid`: the first range of each that names the user (by name or
/// number) and holds at least two ids, trimmed to the shorter of both and [`MAX_IDS`].
fn plan(name: Option<&str>, uid: u32, subuid: &str, subgid: &str) -> Result<(Range, Range), String> {
    let first = |text: &str, file: &str| -> Result<Range, String> {
        let uid = uid.to_string();
        text.lines()
            .filter_map(|line| {
                let mut f = line.trim().split(':');
                let (owner, start, count) = (f.next()?, f.next()?.parse::<u32>().ok()?, f.next()?.parse::<u32>().ok()?);
                ((Some(owner) == name || owner == uid) && count >= 2 && start.checked_add(count).is_some()).then_some((start, count))
            })
            .next()
            .ok_or_else(|| format!("{file} has no range of at least two ids for this user"))
    };
    let (u, g) = (first(subuid, "/etc/subuid")?, first(subgid, "/etc/subgid")?);
    let count = u.1.min(g.1).min(MAX_IDS);
    Ok(((u.0, count), (g.0, count)))
}

/// The lines of a `uid_map` or `gid_map` that map `own` to 0 and `range` from 1, normalised
/// (fields separated by one space).
fn map_lines(own: u32, range: Range) -> String {
    format!("0 {own} 1\n1 {} {}\n", range.0, range.1)
}

/// A map file's text with its fields separated by one space.
fn normalised(text: &str) -> String {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") + "\n").collect()
}

/// How a server did not enter a namespace for subordinate ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// It stays in the host's namespace, as it should: it is root, or not asked, or the user has
    /// no subordinate ids or set-uid helpers, or the state root's sandboxes live there.
    Stayed(String),
    /// Entering was tried and failed; the server is where it was.
    Failed(String),
    /// The server entered a namespace that turned out not to be one for subordinate ids, and
    /// cannot leave it: it must not go on.
    Stuck(String),
}

/// How a server entered its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// It joined the namespace of a live server or sandbox of the state root.
    Joined,
    /// It made a new one.
    Made,
}

/// Puts this unprivileged process in the user namespace of `state_root`'s servers and sandboxes
/// as described at the top of this file; makes one when there is none and `wanted` says so (and
/// the user has subordinate ids and the set-uid helpers). Records this process as a server of
/// the state root either way. Must be called while this process has one thread.
pub fn enter(state_root: &Path, wanted: bool) -> Result<(&'static Entered, Entry), Skipped> {
    let stayed = |why: &str| Err(Skipped::Stayed(why.into()));
    if let Some(Some(done)) = ENTERED.get() {
        return Ok((done, Entry::Joined));
    }
    let uid = rustix::process::getuid().as_raw();
    if uid == 0 {
        return stayed("the server runs as root");
    }
    if normalised(&fs::read_to_string("/proc/self/uid_map").unwrap_or_default()) != "0 0 4294967295\n" {
        return stayed("the server already runs in a user namespace of its own");
    }
    let failed = |what: &str, e: &dyn std::fmt::Display| Skipped::Failed(format!("{what}: {e}"));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_root.join(MEMBERS))
        .map_err(|e| failed("cannot create the state root", &e))?;
    // One server at a time decides, so that two starting together end in one namespace.
    let lock = lock(&state_root.join(LOCK)).map_err(Skipped::Failed)?;
    let ours = fs::metadata("/proc/self/ns/user").map_err(|e| failed("cannot read this process's user namespace", &e))?;
    let ours = (ours.dev(), ours.ino());
    let prefix = record_prefix();
    let found = namespaces(state_root, ours, &prefix);
    let host = found.iter().any(|c| c.in_ours);
    // Checked one by one, and only until one will do (checking an init's costs a process).
    let other = if host { None } else { found.into_iter().find(|c| joinable(c, ours, uid)).map(|c| c.ns) };
    let outcome = if host {
        stayed("live servers or sandboxes of this state root run in the host's user namespace, sharing the server's uid; once none does, servers started later give sandboxes subordinate ids")
    } else if let Some(ns) = other {
        join(&ns, uid, "the user namespace of this state root's servers and sandboxes").map(|e| (e, Entry::Joined))
    } else if !wanted {
        stayed("--subordinate-ids off (or --isolation none)")
    } else {
        match available() {
            Err(why) => stayed(&why),
            Ok(a) => make(&a, uid)
                .map_err(Skipped::Failed)
                .and_then(|ns| join(&ns, uid, "the user namespace made for subordinate ids"))
                .map(|e| (e, Entry::Made)),
        }
    };
    // Later servers find this one here while it lives, in whichever namespace it ended.
    let me = rustix::process::getpid().as_raw_nonzero().get().unsigned_abs();
    if let Some(st) = crate::provider::process::proc_stat(me) {
        let _ = Init { pid: me, start: st.start }.store_as(&state_root.join(MEMBERS), &format!("{prefix}{me}"));
    }
    drop(lock);
    outcome
}

/// The start of the names of server records written in this process's pid namespace (its
/// inode, then `-`): a server reads, and removes when stale, only those, since a pid means
/// nothing in another pid namespace.
fn record_prefix() -> String {
    fs::metadata("/proc/self/ns/pid").map(|m| format!("{}-", m.ino())).unwrap_or_default()
}

/// Takes the exclusive lock `path`, waiting at most [`LOCK_WAIT`].
fn lock(path: &Path) -> Result<fs::File, String> {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot open the state root's namespace lock {}: {e}", path.display()))?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(format!("could not lock {} within {} s: {e}", path.display(), LOCK_WAIT.as_secs())),
        }
    }
}

/// Enters user namespace `ns` (its maps checked beforehand); what this process then is, from its
/// own uid map, which must map 0 to `uid` (this process's host uid) and a range from 1.
fn join(ns: &fs::File, uid: u32, what: &str) -> Result<&'static Entered, Skipped> {
    rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(ns), Some(rustix::thread::LinkNameSpaceType::User))
        .map_err(|e| Skipped::Failed(format!("could not enter {what}: {e}")))?;
    let map = fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let found = from_map(&map).filter(|e| e.host_uid == uid);
    if found.is_none() || ENTERED.set(found).is_err() {
        return Err(Skipped::Stuck(format!(
            "entered {what}, whose uid map ({}) is not one of a namespace for subordinate ids",
            normalised(&map).trim()
        )));
    }
    entered().ok_or_else(|| Skipped::Stuck(format!("entered {what}, then lost it")))
}

/// The user namespace of a live server or sandbox process of a state root.
struct Candidate {
    ns: fs::File,
    /// Whether it is the namespace of the process looking.
    in_ours: bool,
    /// Its uid map as a process of it reads it, where one was at hand (not for an init's parent
    /// namespace).
    map: Option<String>,
}

/// The user namespaces of `state_root`'s live servers (records named with `prefix`, stale ones
/// removed), Landlock spawners, keepers and inits (the namespace an init's own was made in), in
/// that order, each as found: `ours` (device and inode) is this process's. Keepers count only
/// when elsewhere (an unisolated sandbox's keeper shares the host's namespace and holds nothing
/// that needs it).
fn namespaces(state_root: &Path, ours: (u64, u64), prefix: &str) -> Vec<Candidate> {
    let records = |dir: &Path, file: &str| -> Vec<(PathBuf, Option<Init>)> {
        let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
        entries
            .flatten()
            .map(|e| if file.is_empty() { e.path() } else { e.path().join(file) })
            .map(|p| (p.clone(), Init::read(&p)))
            .collect()
    };
    // A live process's namespace with its uid map, or (`parent`) the one its namespace was made
    // in, opened while that process is still the one recorded.
    let of = |p: &Init, parent: bool| -> Option<Candidate> {
        let own = fs::File::open(format!("/proc/{}/ns/user", p.pid)).ok()?;
        let (ns, map) =
            if parent { (parent_of(&own).ok()?, None) } else { (own, fs::read_to_string(format!("/proc/{}/uid_map", p.pid)).ok()) };
        let in_ours = ns_id(&ns)? == ours;
        p.alive().then_some(Candidate { ns, in_ours, map })
    };
    let mut found = Vec::new();
    let ours_only = |(path, _): &(PathBuf, Option<Init>)| path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix));
    for (path, record) in records(&state_root.join(MEMBERS), "").into_iter().filter(ours_only) {
        match record.filter(Init::alive).and_then(|server| of(&server, false)) {
            Some(c) => found.push(c),
            None => {
                let _ = fs::remove_file(path);
            }
        }
    }
    let sandboxes = state_root.join("sandboxes");
    for (file, parent, keeper) in
        [(super::landlock_spawner::RECORD, false, false), ("keeper.pid", false, true), (super::enter::INIT_FILE, true, false)]
    {
        for (_, record) in records(&sandboxes, file) {
            found.extend(record.and_then(|p| of(&p, parent)).filter(|c| !(keeper && c.in_ours)));
        }
    }
    found
}

/// Device and inode of namespace `ns`, which identify it.
fn ns_id(ns: &fs::File) -> Option<(u64, u64)> {
    ns.metadata().map(|m| (m.dev(), m.ino())).ok()
}

/// Whether `c`, another namespace than this process's (`ours`), is one to join: this process's
/// user (`uid`) made it from this namespace, and its maps have the shape [`enter`] makes (read by
/// `nsenter` into it where no process of it was at hand).
fn joinable(c: &Candidate, ours: (u64, u64), uid: u32) -> bool {
    let made_here = owner_of(&c.ns).is_ok_and(|o| o == uid) && parent_of(&c.ns).ok().and_then(|p| ns_id(&p)) == Some(ours);
    made_here
        && c.map
            .clone()
            .or_else(|| helper("nsenter").and_then(|n| map_of(&n, &c.ns)))
            .and_then(|m| from_map(&m))
            .is_some_and(|e| e.host_uid == uid)
}

/// The uid map of user namespace `ns` as a process inside it reads its own: `nsenter` (at
/// `nsenter`) enters it through its stdin and runs `cat`, within [`BUDGET`].
fn map_of(nsenter: &Path, ns: &fs::File) -> Option<String> {
    let cat = helper("cat")?;
    let mut child = Command::new(nsenter)
        .args(["--user=/proc/self/fd/0", "--preserve-credentials", "--"])
        .arg(cat)
        .arg("/proc/self/uid_map")
        .stdin(Stdio::from(ns.try_clone().ok()?))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let status = wait_within(&mut child, Instant::now() + BUDGET).ok()?;
    let mut map = String::new();
    child.stdout.take()?.take(4096).read_to_string(&mut map).ok()?;
    status.success().then_some(map)
}

/// Waits for `child` until `deadline`, killing it (by its pid) then; its exit status, or why not.
fn wait_within(child: &mut Child, deadline: Instant) -> Result<std::process::ExitStatus, String> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {} s", BUDGET.as_secs()));
            }
        }
    }
}

/// The user namespace `ns` was made in (`NS_GET_PARENT`).
#[allow(unsafe_code)]
fn parent_of(ns: &fs::File) -> io::Result<fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: `NS_GET_PARENT` takes no argument; on success it returns a new descriptor
    // (close-on-exec), which nothing else owns, so the `File` may take it. `ns` is open while
    // borrowed. rustix has no wrapper for this request.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_PARENT) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: see above: `fd` is a fresh descriptor of this process, owned by no one yet.
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

/// The uid (in this process's namespace) of the user who made user namespace `ns`
/// (`NS_GET_OWNER_UID`).
#[allow(unsafe_code)]
fn owner_of(ns: &fs::File) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut uid: libc::uid_t = 0;
    // SAFETY: `NS_GET_OWNER_UID` writes one `uid_t` through the pointer, which points at `uid`,
    // alive for the call; `ns` is open while borrowed.
    let done = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_OWNER_UID, &mut uid as *mut libc::uid_t) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(uid)
}

/// What this process's user could map: its ranges and the set-uid helpers.
struct Available {
    uids: Range,
    gids: Range,
    newuidmap: PathBuf,
    newgidmap: PathBuf,
}

/// The subordinate ids this process's user could give its sandboxes (first host id, count), or
/// why none: no ranges in `/etc/subuid` and `/etc/subgid`, or no `newuidmap`/`newgidmap`.
pub fn usable() -> Result<(u32, u32), String> {
    available().map(|a| a.uids)
}

/// [`usable`], with the helpers and the gid range.
fn available() -> Result<Available, String> {
    let uid = rustix::process::getuid().as_raw();
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default();
    let name = read("/etc/passwd").lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_string())
    });
    let (uids, gids) = plan(name.as_deref(), uid, &read("/etc/subuid"), &read("/etc/subgid"))?;
    let (Some(newuidmap), Some(newgidmap)) = (helper("newuidmap"), helper("newgidmap")) else {
        return Err("newuidmap and newgidmap were not both found (install the uidmap package)".into());
    };
    Ok(Available { uids, gids, newuidmap, newgidmap })
}

/// `name` in the system's program directories (never `PATH`: these are set-uid helpers).
fn helper(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"].iter().map(|d| Path::new(d).join(name)).find(|p| crate::provider::process::is_executable(p))
}

/// Makes a user namespace with the maps of `a` for this process's user (`uid`): a helper process
/// (util-linux `unshare --user`, then `cat` waiting on a pipe) makes it, the set-uid helpers map
/// it, and once its maps are the ones asked for, the helper's namespace is returned opened; the
/// helper ends when its pipe closes. Everything within [`BUDGET`].
fn make(a: &Available, uid: u32) -> Result<fs::File, String> {
    let gid = rustix::process::getgid().as_raw();
    let want = (map_lines(uid, a.uids), map_lines(gid, a.gids));
    let deadline = Instant::now() + BUDGET;
    let unshare = helper("unshare").ok_or("util-linux unshare was not found")?;
    let mut holder = Command::new(unshare)
        .args(["--user", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start unshare --user: {e}"))?;
    let pid = holder.id();
    let made = (|| {
        let ours = fs::read_link("/proc/self/ns/user").map_err(|e| format!("cannot read this process's user namespace: {e}"))?;
        // The helper made its namespace once its link differs from ours.
        loop {
            if let Ok(Some(status)) = holder.try_wait() {
                return Err(format!("unshare --user failed ({status}): {}", said(&mut holder)));
            }
            match fs::read_link(format!("/proc/{pid}/ns/user")) {
                Ok(link) if link != ours => break,
                _ if Instant::now() > deadline => return Err(format!("unshare --user made no namespace within {} s", BUDGET.as_secs())),
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        for (program, own, range) in [(&a.newuidmap, uid, a.uids), (&a.newgidmap, gid, a.gids)] {
            let mut child = Command::new(program)
                .arg(pid.to_string())
                .args(["0", &own.to_string(), "1", "1", &range.0.to_string(), &range.1.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not run {}: {e}", program.display()))?;
            let status = wait_within(&mut child, deadline).map_err(|why| format!("{} {why}", program.display()))?;
            if !status.success() {
                return Err(format!("{} failed ({status}): {}", program.display(), said(&mut child)));
            }
        }
        let map = |f: &str| fs::read_to_string(format!("/proc/{pid}/{f}")).map(|t| normalised(&t)).unwrap_or_default();
        if (map("uid_map"), map("gid_map")) != want {
            return Err(format!("the set-uid helpers reported success but did not map the namespace as asked ({:?})", map("uid_map")));
        }
        fs::File::open(format!("/proc/{pid}/ns/user")).map_err(|e| format!("cannot open the new user namespace: {e}"))
    })();
    drop(holder.stdin.take());
    let _ = holder.kill();
    let _ = holder.wait();
    made
}

/// The first few hundred bytes a finished child wrote to its stderr pipe, as one line.
fn said(child: &mut Child) -> String {
    let mut text = Vec::new();
    if let Some(err) = child.stderr.take() {
        let _ = err.take(400).read_to_end(&mut text);
    }
    String::from_utf8_lossy(&text).split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_takes_the_first_usable_range_of_each_file_by_name_or_number() {
        let subuid = "bob:100000:65536\nalice:1:1\nalice:200000:70000\n";
        let subgid = "1000:300000:1000\n";
        assert_eq!(plan(Some("alice"), 1000, subuid, subgid), Ok(((200_000, 1000), (300_000, 1000))));
        let wide = "alice:200000:1000000\n";
        assert_eq!(plan(Some("alice"), 1000, wide, wide), Ok(((200_000, MAX_IDS), (200_000, MAX_IDS))));
        let none = plan(Some("carol"), 1001, subuid, subgid).unwrap_err();
        assert!(none.contains("/etc/subuid"), "{none}");
        let overflow = "alice:4294967295:2\n";
        assert!(plan(Some("alice"), 1000, overflow, overflow).is_err());
    }

    #[test]
    fn maps_compare_whatever_their_spacing() {
        let kernel = "         0       1000          1\n         1     200000      65536\n";
        assert_eq!(normalised(kernel), map_lines(1000, (200_000, 65_536)));
    }

    #[test]
    fn only_a_map_of_the_made_shape_is_a_namespace_for_subordinate_ids() {
        let made = "         0       1000          1\n         1     200000      65536\n";
        let e = from_map(made).unwrap();
        assert_eq!((e.count, e.host_uid, e.first_host_uid), (65_536, 1000, 200_000));
        assert_eq!((e.host_id(0), e.host_id(1), e.host_id(65_536)), (1000, 200_000, 265_535));
        assert_eq!(e.sandbox_ids(), (1, 65_535));
        // Rootless containers map their root the same way: without the server's marker, a
        // process is in no namespace for subordinate ids.
        assert_eq!(handed(false, made), None);
        assert_eq!(handed(true, made), Some(e));
        for other in ["0 0 4294967295\n", "0 1000 1\n", "0 100000 65536\n", "0 1000 1\n2 200000 10\n", "0 1000 2\n1 200000 10\n", ""] {
            assert_eq!(from_map(other), None, "{other:?}");
        }
    }
}
