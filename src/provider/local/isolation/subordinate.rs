//! Subordinate ids: the user namespace an unprivileged server enters at start so that each of its
//! isolated sandboxes gets a host uid of its own, as under a root server.
//!
//! A user with ranges in `/etc/subuid` and `/etc/subgid` may map them, through the set-uid
//! helpers `newuidmap` and `newgidmap`, into a user namespace it owns. The server's namespace maps
//! its own uid and gid to 0 and ids `1..=count` to the first `count` subordinate ids (at most
//! [`MAX_IDS`]); inside it the server is root, and the root server's code paths apply: each
//! sandbox gets one id of `1..count` (mapped to a subordinate id on the host, see
//! [`super::uids`]), the probe runs as id `count`.
//!
//! Every server process of a state root must be in the same namespace: a process outside it
//! cannot signal, trace or read the files of sandboxes made inside it. So a starting server, under
//! the state root's lock, joins the namespace of a live server of the state root (each records
//! itself in [`MEMBERS`]) or of a live keeper of its sandboxes whose maps are the ones it would
//! make; only where there is none does it make a new one (a namespace with the same maps gives the
//! same host ids, so files left by earlier ones stay readable). While sandboxes made without
//! subordinate ids live (their keepers share the server's own namespace), it stays where it is.
//! Joining or making happens before the process has a second thread, as `setns` demands. Where
//! any step fails, the server stays where it was and its sandboxes share its uid, as without
//! subordinate ids; the log says why.

use super::enter::Init;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The most subordinate ids a server maps (as many sandboxes as it may hold, and the probe).
pub const MAX_IDS: u32 = 65_536;

/// How long making a namespace may take (the helper's start and both set-uid helpers).
const BUDGET: Duration = Duration::from_secs(5);

/// The namespace this server entered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entered {
    /// Ids `1..=count` inside are subordinate ids on the host.
    pub count: u32,
    /// The server's host uid (0 inside).
    pub host_uid: u32,
    /// The host uid that id 1 inside maps to.
    pub first_host_uid: u32,
    /// Whether it joined the namespace of a live server or keeper (else it made one).
    pub joined: bool,
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
}

static ENTERED: OnceLock<Entered> = OnceLock::new();

/// The namespace this process entered at start, if it did.
pub fn entered() -> Option<&'static Entered> {
    ENTERED.get()
}

/// Whether this process is root of the host's own user namespace (not root of a namespace it
/// entered for subordinate ids, which cannot mount block devices or write the host's cgroups).
pub fn host_root() -> bool {
    rustix::process::geteuid().is_root() && entered().is_none()
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

/// Why a server did not enter a namespace for subordinate ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// There is nothing to enter: the server is root, already in a user namespace of its own, or
    /// the user has no subordinate ids or no set-uid helpers.
    Unavailable(String),
    /// Entering was tried and failed.
    Failed(String),
}

/// Enters the user namespace described at the top of this file when this process is not root
/// and the user has subordinate ids and the set-uid helpers: joins the namespace of a live server
/// or keeper of `state_root` whose maps are the ones it would make, else makes one. Must be
/// called while this process has one thread.
pub fn enter(state_root: &Path) -> Result<&'static Entered, Skipped> {
    if let Some(done) = entered() {
        return Ok(done);
    }
    let (uid, gid) = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
    let unavailable = |why: &str| Err(Skipped::Unavailable(why.into()));
    if uid == 0 {
        return unavailable("the server runs as root");
    }
    if normalised(&fs::read_to_string("/proc/self/uid_map").unwrap_or_default()) != "0 0 4294967295\n" {
        return unavailable("the server already runs in a user namespace of its own");
    }
    let Available { uids, gids, newuidmap, newgidmap } = match available() {
        Ok(a) => a,
        Err(why) => return unavailable(&why),
    };
    let want = (map_lines(uid, uids), map_lines(gid, gids));
    let done = |joined: bool| Entered { count: uids.1, host_uid: uid, first_host_uid: uids.0, joined };
    let failed = |what: &str, e: &dyn std::fmt::Display| Skipped::Failed(format!("{what}: {e}"));
    // One server at a time decides, so that two starting together end in one namespace.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_root.join(MEMBERS))
        .map_err(|e| failed("cannot create the state root", &e))?;
    let lock = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(state_root.join(LOCK))
        .map_err(|e| failed("cannot open the state root's namespace lock", &e))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| failed("cannot lock the state root", &e))?;
    let ours = fs::read_link("/proc/self/ns/user").map_err(|e| failed("cannot read this process's user namespace", &e))?;
    let members = members(state_root);
    let in_ours = |p: &Init| fs::read_link(format!("/proc/{}/ns/user", p.pid)).is_ok_and(|l| l == ours);
    if members.iter().any(|(p, keeper)| *keeper && in_ours(p)) {
        return unavailable("live sandboxes of this state root share the server's uid (made without subordinate ids); sandboxes made after they all ended get uids of their own");
    }
    let join = |ns: fs::File, what: &str| {
        rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(&ns), Some(rustix::thread::LinkNameSpaceType::User))
            .map_err(|e| failed(&format!("could not enter {what}"), &e))
    };
    let joined = match members.iter().find_map(|(p, _)| namespace_of(p, &want)) {
        Some(ns) => {
            join(ns, "the user namespace of this state root's servers and sandboxes")?;
            true
        }
        None => {
            let ns = make(&newuidmap, &newgidmap, uid, gid, uids, gids).map_err(Skipped::Failed)?;
            join(ns, "the user namespace made for subordinate ids")?;
            false
        }
    };
    // Later servers find this one here while it lives.
    let me = rustix::process::getpid().as_raw_nonzero().get().unsigned_abs();
    if let Some(st) = crate::provider::process::proc_stat(me) {
        let _ = Init { pid: me, start: st.start }.store_as(&state_root.join(MEMBERS), &me.to_string());
    }
    drop(lock);
    Ok(ENTERED.get_or_init(|| done(joined)))
}

/// The state root's directory of the servers in its namespace for subordinate ids, one record
/// (`<pid> <start time>`) per server, named by its pid.
const MEMBERS: &str = "userns-members";

/// The lock a starting server holds while it decides which namespace to enter.
const LOCK: &str = "userns.lock";

/// The live processes of `state_root` that may hold its namespace: its live servers' records
/// (stale ones are removed) and its sandboxes' live keepers (`true`).
fn members(state_root: &Path) -> Vec<(Init, bool)> {
    let records = |dir: &Path, file: &str| -> Vec<(PathBuf, Option<Init>)> {
        let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
        entries
            .flatten()
            .map(|e| if file.is_empty() { e.path() } else { e.path().join(file) })
            .map(|p| (p.clone(), Init::read(&p)))
            .collect()
    };
    let mut live = Vec::new();
    for (path, record) in records(&state_root.join(MEMBERS), "") {
        match record.filter(Init::alive) {
            Some(server) => live.push((server, false)),
            None => {
                let _ = fs::remove_file(path);
            }
        }
    }
    live.extend(
        records(&state_root.join("sandboxes"), "keeper.pid").into_iter().filter_map(|(_, r)| r.filter(Init::alive)).map(|k| (k, true)),
    );
    live
}

/// The user namespace of live process `p`, opened, when its uid and gid maps are `want`.
fn namespace_of(p: &Init, want: &(String, String)) -> Option<fs::File> {
    let at = |f: &str| fs::read_to_string(format!("/proc/{}/{f}", p.pid)).map(|t| normalised(&t)).ok();
    if at("uid_map")? != want.0 || at("gid_map")? != want.1 {
        return None;
    }
    let ns = fs::File::open(format!("/proc/{}/ns/user", p.pid)).ok()?;
    // Still that process (not one that took its pid since the maps were read).
    p.alive().then_some(ns)
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

/// Makes a user namespace with the maps of [`plan`]: a helper process (util-linux `unshare
/// --user`, then `cat` waiting on a pipe) makes it, the set-uid helpers map it, and the helper's
/// namespace is returned opened; the helper ends when its pipe closes.
fn make(newuidmap: &Path, newgidmap: &Path, uid: u32, gid: u32, uids: Range, gids: Range) -> Result<fs::File, String> {
    let unshare = helper("unshare").ok_or("util-linux unshare was not found")?;
    let mut holder = Command::new(unshare)
        .args(["--user", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not start unshare --user: {e}"))?;
    let made = (|| {
        let pid = holder.id();
        let ours = fs::read_link("/proc/self/ns/user").map_err(|e| format!("cannot read this process's user namespace: {e}"))?;
        let deadline = Instant::now() + BUDGET;
        // The helper made its namespace once its link differs from ours.
        loop {
            match fs::read_link(format!("/proc/{pid}/ns/user")) {
                Ok(link) if link != ours => break,
                _ if Instant::now() > deadline => return Err(format!("unshare --user made no namespace within {} s", BUDGET.as_secs())),
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        for (program, own, range) in [(newuidmap, uid, uids), (newgidmap, gid, gids)] {
            let out = Command::new(program)
                .arg(pid.to_string())
                .args(["0", &own.to_string(), "1", "1", &range.0.to_string(), &range.1.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| format!("could not run {}: {e}", program.display()))?;
            if !out.status.success() {
                let said = String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(400)]).trim().to_string();
                return Err(format!("{} failed ({}): {said}", program.display(), out.status));
            }
        }
        fs::File::open(format!("/proc/{pid}/ns/user")).map_err(|e| format!("cannot open the new user namespace: {e}"))
    })();
    drop(holder.stdin.take());
    let _ = holder.kill();
    let _ = holder.wait();
    made
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
}
