//! Memory and process limits of local sandboxes, enforced with cgroups.
//!
//! A sandbox with limits gets one cgroup per controller (cgroup v1: `memory` and `pids`
//! hierarchies) or one cgroup with both controllers (cgroup v2), named after the sandbox under a
//! `sandbox-mcp` directory nested in the server's own cgroup (v1) or beside it (v2, where a
//! cgroup with processes cannot hand controllers to children). The limits are written on that
//! cgroup; the sandbox's processes live in its child [`LEAF`], which every process of the sandbox
//! joins before it runs anything: the `unshare` that makes the init (so the init's cgroup
//! namespace is rooted at the leaf, and a hierarchy mounted inside shows nothing of other
//! sandboxes or of the host), and every exec entered from the host ([`super::enter`]). Sandbox
//! root cannot raise its limits or leave: the cgroup that holds them lies above the root of its
//! cgroup namespace, out of its sight, and limits hold for every descendant, whatever it writes
//! on the leaf. Swap is limited to zero where the kernel accounts it, so the memory limit is a
//! limit. A limit the host cannot enforce (no writable cgroup) is refused with the reason.
//!
//! Where the `cpu` controller can be used too (a v1 `cpu` hierarchy, or `cpu` among the v2
//! controllers), a sandbox with limits also gets a cpu cgroup of its own with the default weight:
//! sandboxes then share a contended processor equally, however many threads each runs. It is
//! best effort (no limit is asked for, so nothing is refused when it is missing).

use super::IsolationError;
use crate::provider::Limits;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ROOT: &str = "/sys/fs/cgroup";

/// The child of a sandbox's cgroup that holds its processes (the limits sit on its parent).
pub const LEAF: &str = "sandbox";

/// Where a sandbox's cgroups live on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// cgroup v2: one directory for both controllers.
    V2 { base: PathBuf },
    /// cgroup v1: one directory per controller (`cpu` where that hierarchy is mounted).
    V1 { memory: PathBuf, pids: PathBuf, cpu: Option<PathBuf> },
}

/// The server's own cgroup path in the hierarchy whose `/proc/self/cgroup` line ends in `:key:`
/// (`""` for v2, `memory`, `pids`).
fn own_path(controller: &str) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        (ctrls.split(',').any(|c| c == controller)).then(|| path.to_string())
    })
}

fn layout() -> Result<Layout, String> {
    let root = Path::new(ROOT);
    if root.join("cgroup.controllers").exists() {
        let have = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if !(have.split_whitespace().any(|c| c == "memory") && have.split_whitespace().any(|c| c == "pids")) {
            return Err("cgroup v2 has no memory and pids controllers here".into());
        }
        let own = own_path("").unwrap_or_default();
        let parent = Path::new(own.trim_start_matches('/')).parent().map(Path::to_path_buf).unwrap_or_default();
        return Ok(Layout::V2 { base: root.join(parent).join("sandbox-mcp") });
    }
    let (memory, pids) = (root.join("memory"), root.join("pids"));
    if !memory.is_dir() || !pids.is_dir() {
        return Err(format!("neither cgroup v2 at {ROOT} nor the v1 memory and pids hierarchies are mounted"));
    }
    let nest = |dir: PathBuf, ctl: &str| {
        let own = own_path(ctl).unwrap_or_default();
        let own_dir = dir.join(own.trim_start_matches('/'));
        // Inside a cgroup namespace the server's own path may not be visible: use the mount's root.
        if own_dir.is_dir() { own_dir } else { dir }.join("sandbox-mcp")
    };
    let cpu = root.join("cpu");
    let cpu = cpu.is_dir().then(|| nest(cpu, "cpu"));
    Ok(Layout::V1 { memory: nest(memory, "memory"), pids: nest(pids, "pids"), cpu })
}

/// Why limits cannot be enforced on this host, or `Ok` (checks that a cgroup can be created).
pub fn check() -> Result<(), IsolationError> {
    let probe = format!("probe-{}", crate::ids::random_hex(4));
    let made = create(&probe, &Limits { memory_mb: Some(1024), processes: Some(1024), disk_mb: None });
    remove(&probe, Instant::now() + Duration::from_secs(1));
    made.map(|_| ())
}

/// Creates the cgroups of sandbox `id` with `limits`; returns the `cgroup.procs` files its
/// processes must join.
pub fn create(id: &str, limits: &Limits) -> Result<Vec<PathBuf>, IsolationError> {
    create_groups(id, limits).map_err(IsolationError)
}

/// [`create`], its error as a sentence.
fn create_groups(id: &str, limits: &Limits) -> Result<Vec<PathBuf>, String> {
    let layout = layout()?;
    let uid = super::subordinate::host_uid();
    let denied = |dir: &Path, e: io::Error| {
        format!(
            "cannot create the cgroup {} ({e}); limits need a writable cgroup: run the server as root, or where a cgroup v2 subtree is delegated to uid {uid} (a systemd user session)",
            dir.display()
        )
    };
    let write = |file: PathBuf, value: String| fs::write(&file, value).map_err(|e| format!("cannot write {}: {e}", file.display()));
    match layout {
        Layout::V2 { base } => {
            fs::create_dir_all(&base).map_err(|e| denied(&base, e))?;
            if let Some(parent) = base.parent() {
                let _ = fs::write(parent.join("cgroup.subtree_control"), "+memory +pids");
                let _ = fs::write(parent.join("cgroup.subtree_control"), "+cpu");
            }
            write(base.join("cgroup.subtree_control"), "+memory +pids".into())?;
            // The processor share, where the controller is available (best effort).
            let _ = fs::write(base.join("cgroup.subtree_control"), "+cpu");
            let dir = base.join(id);
            fs::create_dir(&dir).map_err(|e| denied(&dir, e))?;
            if let Some(mb) = limits.memory_mb {
                write(dir.join("memory.max"), (mb * 1024 * 1024).to_string())?;
                let _ = fs::write(dir.join("memory.swap.max"), "0");
            }
            if let Some(n) = limits.processes {
                write(dir.join("pids.max"), n.to_string())?;
            }
            let leaf = dir.join(LEAF);
            fs::create_dir(&leaf).map_err(|e| denied(&leaf, e))?;
            Ok(vec![leaf.join("cgroup.procs")])
        }
        Layout::V1 { memory, pids, cpu } => {
            let (mem_dir, pids_dir) = (memory.join(id), pids.join(id));
            for dir in [&mem_dir, &pids_dir] {
                fs::create_dir_all(dir).map_err(|e| denied(dir, e))?;
            }
            if let Some(mb) = limits.memory_mb {
                let bytes = (mb * 1024 * 1024).to_string();
                write(mem_dir.join("memory.limit_in_bytes"), bytes.clone())?;
                // Memory plus swap, where swap accounting is on.
                let _ = fs::write(mem_dir.join("memory.memsw.limit_in_bytes"), bytes);
            }
            if let Some(n) = limits.processes {
                write(pids_dir.join("pids.max"), n.to_string())?;
            }
            let leaves = [mem_dir.join(LEAF), pids_dir.join(LEAF)];
            for leaf in &leaves {
                fs::create_dir(leaf).map_err(|e| denied(leaf, e))?;
            }
            let mut procs: Vec<PathBuf> = leaves.iter().map(|l| l.join("cgroup.procs")).collect();
            // The processor share, where the hierarchy can be written (best effort).
            if let Some(leaf) = cpu.map(|c| c.join(id).join(LEAF)) {
                if fs::create_dir_all(&leaf).is_ok() {
                    procs.push(leaf.join("cgroup.procs"));
                }
            }
            Ok(procs)
        }
    }
}

/// The cgroup directories of sandbox `id` (existing or not).
fn dirs(id: &str) -> Vec<PathBuf> {
    match layout() {
        Ok(Layout::V2 { base }) => vec![base.join(id)],
        Ok(Layout::V1 { memory, pids, cpu }) => [Some(memory), Some(pids), cpu].into_iter().flatten().map(|d| d.join(id)).collect(),
        Err(_) => vec![],
    }
}

/// The `cgroup.procs` files of sandbox `id` that its processes join (none when it has no
/// limits): its leaves, or its own cgroups for a sandbox made before leaves existed.
pub fn procs_files(id: &str) -> Vec<PathBuf> {
    dirs(id)
        .into_iter()
        .map(|d| if d.join(LEAF).is_dir() { d.join(LEAF) } else { d })
        .map(|d| d.join("cgroup.procs"))
        .filter(|p| p.exists())
        .collect()
}

/// Removes the cgroups of sandbox `id` once they are empty (retrying until `deadline`).
pub fn remove(id: &str, deadline: Instant) {
    for dir in dirs(id).into_iter().flat_map(|d| [d.join(LEAF), d]).filter(|d| d.is_dir()) {
        loop {
            match fs::remove_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => break,
            }
        }
    }
}
