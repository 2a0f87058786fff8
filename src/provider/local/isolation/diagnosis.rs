//! The diagnosis `sandbox-mcp doctor` prints: what this host allows for isolating local
//! sandboxes, the tier `--isolation auto` picks here, and for each missing piece the command or
//! setting that would give a stronger tier.

use super::{cgroup, disk, landlock, probe, tools, Isolation};
use serde::Serialize;
use std::path::Path;

/// One fact of the diagnosis.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was looked at (`user_namespaces`, `landlock`, ...).
    pub name: &'static str,
    /// Whether it is there and works.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What would make it work, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

/// The whole diagnosis.
#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    /// The running kernel's release.
    pub kernel: String,
    /// The tier `--isolation auto` picks: `namespaces`, `landlock`, or `none` when it would
    /// refuse to create sandboxes.
    pub auto_tier: &'static str,
    /// The layers a sandbox of that tier gets.
    pub layers: Vec<&'static str>,
    /// Every fact looked at.
    pub checks: Vec<Check>,
}

impl Diagnosis {
    /// Whether some isolated tier is available (the exit status of `doctor`).
    pub fn isolated(&self) -> bool {
        self.auto_tier != "none"
    }

    /// The diagnosis as lines for a person.
    pub fn text(&self) -> String {
        let mut out = format!("kernel {}\n", self.kernel);
        for c in &self.checks {
            out.push_str(&format!("[{}] {}: {}\n", if c.ok { "ok" } else { "--" }, c.name, c.detail));
            if let Some(r) = &c.remedy {
                out.push_str(&format!("     fix: {r}\n"));
            }
        }
        match self.auto_tier {
            "none" => out.push_str("--isolation auto: refuses to create sandboxes here (no isolated tier); apply a fix above, or choose --isolation none explicitly\n"),
            tier => out.push_str(&format!("--isolation auto: {tier} (layers: {})\n", self.layers.join(", "))),
        }
        out
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Looks at this host.
pub fn diagnose() -> Diagnosis {
    let kernel = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into());
    let mut checks = Vec::new();
    let tools_found = tools();
    checks.push(Check {
        name: "util_linux",
        ok: tools_found.is_ok(),
        detail: match &tools_found {
            Ok(t) => format!("unshare {}, nsenter {}, setsid {}", t.unshare.display(), t.nsenter.display(), t.setsid.display()),
            Err(e) => e.0.clone(),
        },
        remedy: tools_found.is_err().then(|| "install util-linux (apt-get install util-linux, dnf install util-linux)".into()),
    });
    let userns = probe();
    let userns_remedy = || {
        if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            "sysctl -w kernel.unprivileged_userns_clone=1".to_string()
        } else if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
            "sysctl -w user.max_user_namespaces=15000".to_string()
        } else if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for sandbox-mcp with the userns permission"
                .to_string()
        } else {
            "give the server CAP_SYS_ADMIN-free user namespaces: check the container's seccomp profile and the sysctls user.max_user_namespaces, kernel.unprivileged_userns_clone".to_string()
        }
    };
    checks.push(Check {
        name: "user_namespaces",
        ok: userns.is_ok(),
        detail: match &userns {
            Ok(()) => "a user namespace with mount, pid, net, ipc and uts namespaces can be created".into(),
            Err(e) => e.0.clone(),
        },
        remedy: userns.is_err().then(userns_remedy),
    });
    let abi = landlock::abi();
    checks.push(Check {
        name: "landlock",
        ok: abi > 0,
        detail: match abi {
            0 => "not available".into(),
            n => {
                let mut has = vec!["file access"];
                if n >= 4 {
                    has.push("TCP bind and connect");
                }
                if n >= 6 {
                    has.push("abstract unix socket and signal scoping");
                }
                format!("ABI {n}: {}", has.join(", "))
            }
        },
        remedy: match abi {
            0 => Some(
                "use Linux 5.13 or later with Landlock enabled (boot with lsm=landlock,... or a kernel whose CONFIG_LSM lists landlock)"
                    .into(),
            ),
            1..=3 => Some("Linux 6.7 or later (Landlock ABI 4) also confines TCP".into()),
            _ => None,
        },
    });
    let seccomp = Path::new("/proc/sys/kernel/seccomp/actions_avail").exists();
    checks.push(Check {
        name: "seccomp",
        ok: seccomp,
        detail: if seccomp { "seccomp filters are available".into() } else { "the kernel has no seccomp filters".into() },
        remedy: (!seccomp).then(|| "use a kernel built with CONFIG_SECCOMP_FILTER".into()),
    });
    let version = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() { "v2" } else { "v1" };
    let limits = cgroup::check();
    checks.push(Check {
        name: "cgroup",
        ok: limits.is_ok(),
        detail: match &limits {
            Ok(()) => format!("cgroup {version}; a limits cgroup (memory, pids) is writable"),
            Err(e) => format!("cgroup {version}; {}", e.0),
        },
        remedy: limits.is_err().then(|| "run the server as root, or in a systemd user session with a delegated cgroup v2 subtree (systemd-run --user --scope -p Delegate=yes sandbox-mcp ...)".into()),
    });
    let quick_attach = favors_dynamic_cgroups(&read("/proc/self/mounts").unwrap_or_default());
    checks.push(Check {
        name: "cgroup_attach",
        ok: quick_attach || limits.is_err(),
        detail: if quick_attach {
            "a cgroup hierarchy is mounted with favordynmods: a new sandbox joins its limits cgroups at once".into()
        } else {
            "no cgroup hierarchy is mounted with favordynmods: a create_sandbox with limits that follows an idle moment waits for an RCU grace period when it joins its cgroups (5-11 ms measured)".into()
        },
        remedy: (!quick_attach && limits.is_ok()).then(|| {
            let how = if version == "v2" {
                "mount -o remount,favordynmods /sys/fs/cgroup"
            } else {
                // v1 hierarchies cannot take the option on remount; a new named one can, and it
                // applies to every hierarchy.
                "mkdir -p /run/cgroup-dynmods && mount -t cgroup -o none,name=dynmods,favordynmods cgroup /run/cgroup-dynmods"
            };
            format!("{how}, or a kernel built with CONFIG_CGROUP_FAVOR_DYNMODS (fork and exit then cost a little more)")
        }),
    });
    let disks = disk::check(Isolation::Namespaces);
    checks.push(Check {
        name: "disk",
        ok: disks.is_ok(),
        detail: match &disks {
            Ok(()) => "limits.disk_mb can be enforced: the server is root, with loop devices, mkfs.ext4 and mount".into(),
            Err(why) => format!("limits.disk_mb is refused here: {}", why.split("; ").next().unwrap_or(why)),
        },
        remedy: disks.as_ref().err().map(|why| why.split("; ").last().unwrap_or(why).to_string()),
    });
    let user = std::env::var("USER").unwrap_or_default();
    let subids = super::subordinate::usable();
    checks.push(Check {
        name: "subordinate_ids",
        ok: subids.is_ok(),
        detail: match &subids {
            Ok((first, count)) => format!(
                "subordinate ids {first}-{} and newuidmap: an unprivileged server gives each isolated sandbox one of them (unless started with --subordinate-ids off, or while servers or sandboxes of its state root share its uid)",
                u64::from(*first) + u64::from(*count) - 1
            ),
            Err(why) => format!("an unprivileged server's sandboxes share its uid: {why}"),
        },
        remedy: subids.is_err().then(|| {
            let who = if user.is_empty() { "USER".to_string() } else { user.clone() };
            format!("usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {who}, and install the uidmap package")
        }),
    });
    let root = rustix::process::getuid().is_root();
    checks.push(Check {
        name: "sandbox_uid",
        ok: root || subids.is_ok(),
        detail: if root {
            "the server runs as root: each isolated sandbox (namespaces or landlock) gets a host uid of its own from --uid-range".into()
        } else if subids.is_ok() {
            "the server is not root: each isolated sandbox gets one of this user's subordinate ids as its host uid".into()
        } else {
            "the server is not root and this user cannot use subordinate ids: sandboxes share the server's uid (per-user quotas; landlock-tier commands can also signal the server user's processes)".into()
        },
        remedy: None,
    });
    let auto_tier = match (userns.is_ok(), abi > 0) {
        (true, _) => "namespaces",
        (false, true) => "landlock",
        _ => "none",
    };
    let layers = match auto_tier {
        "namespaces" => super::namespace_layers(false),
        "landlock" => landlock::layers(abi, root, true, root),
        _ => Vec::new(),
    };
    Diagnosis { kernel, auto_tier, layers, checks }
}

/// Whether a cgroup hierarchy in `mounts` (the text of `/proc/self/mounts`) has the
/// `favordynmods` option: the kernel then moves processes between cgroups without waiting for an
/// RCU grace period (the option of one hierarchy applies to all).
fn favors_dynamic_cgroups(mounts: &str) -> bool {
    mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        matches!(fields[..], [_, _, "cgroup" | "cgroup2", options, ..] if options.split(',').any(|o| o == "favordynmods"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn favordynmods_is_found_on_any_cgroup_hierarchy() {
        let v1 = "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n";
        assert!(!favors_dynamic_cgroups(v1));
        assert!(favors_dynamic_cgroups(&format!("{v1}cgroup /sys/fs/cgroup/pids cgroup rw,relatime,favordynmods,pids 0 0\n")));
        assert!(favors_dynamic_cgroups("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nsdelegate,favordynmods,memory_recursiveprot 0 0\n"));
        assert!(!favors_dynamic_cgroups("tmpfs /favordynmods tmpfs rw,favordynmods 0 0\n"));
    }

    #[test]
    fn the_diagnosis_names_every_piece_and_a_tier() {
        let d = diagnose();
        let names: Vec<&str> = d.checks.iter().map(|c| c.name).collect();
        for want in ["util_linux", "user_namespaces", "landlock", "seccomp", "cgroup", "disk", "subordinate_ids"] {
            assert!(names.contains(&want), "{want} missing: {names:?}");
        }
        assert!(d.checks.iter().all(|c| c.ok || c.remedy.is_some() || c.name == "sandbox_uid"), "{d:?}");
        assert!(d.text().contains("--isolation auto"));
    }
}
