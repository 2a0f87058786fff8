//! Host uids of isolated sandboxes when the server runs as root: one uid (and the gid of the same
//! number) per sandbox, from a range that no user, group or subordinate-id owner has
//! (`--uid-range`). Sandboxes then share no per-user kernel quota (processes, keys, inotify
//! watches, user namespaces) and cannot signal one another's processes, and no host user owns
//! their files.
//!
//! A sandbox's uid is picked when it is created (under the state root's create lock when the
//! sandbox cap is on), at random in the range, skipping uids of the state root's live sandboxes
//! and uids any process of the host runs as (the sandboxes of other servers sharing the range),
//! and recorded in its metadata (`owner`), where every later server process finds it.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;

/// A range of host uids (and gids of the same numbers), `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// The last uid (inclusive).
    pub last: u32,
}

impl UidRange {
    /// The range `first..=last` (as the configuration checked it: `first ≤ last`).
    pub fn new((first, last): (u32, u32)) -> UidRange {
        UidRange { first: first.min(last), last }
    }

    fn overlaps(&self, start: u64, count: u64) -> bool {
        count > 0 && start <= u64::from(self.last) && start + count > u64::from(self.first)
    }

    fn contains(&self, id: u64) -> bool {
        self.overlaps(id, 1)
    }

    /// Why the range is not free on this host: it overlaps a subordinate range of `/etc/subuid`
    /// or `/etc/subgid`, or holds a uid of `/etc/passwd` or a gid of `/etc/group`. A server in a
    /// namespace of its own for subordinate ids ([`super::subordinate`]) has nothing to check:
    /// its ids there are its user's own subordinate ids on the host.
    pub fn check_free(&self) -> Result<(), String> {
        if super::subordinate::entered().is_some() {
            return Ok(());
        }
        self.check_free_in(&read("/etc/subuid"), &read("/etc/subgid"), &read("/etc/passwd"), &read("/etc/group"))
    }

    fn check_free_in(&self, subuid: &str, subgid: &str, passwd: &str, group: &str) -> Result<(), String> {
        let range = format!("{}-{}", self.first, self.last);
        let fix = "choose a free range with --uid-range FIRST-LAST (SANDBOX_MCP_UID_RANGE)";
        for (file, text) in [("/etc/subuid", subuid), ("/etc/subgid", subgid)] {
            for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                let f: Vec<&str> = line.split(':').collect();
                if let [owner, start, count] = f[..] {
                    if let (Ok(start), Ok(count)) = (start.trim().parse::<u64>(), count.trim().parse::<u64>()) {
                        if self.overlaps(start, count) {
                            return Err(format!("the sandbox uid range {range} overlaps {owner}'s subordinate ids in {file}; {fix}"));
                        }
                    }
                }
            }
        }
        for (file, text, what) in [("/etc/passwd", passwd, "uid"), ("/etc/group", group, "gid")] {
            for line in text.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if let Some(id) = f.get(2).and_then(|v| v.trim().parse::<u64>().ok()) {
                    if self.contains(id) {
                        return Err(format!("the sandbox uid range {range} holds {what} {id} ({}) of {file}; {fix}", f[0]));
                    }
                }
            }
        }
        Ok(())
    }

    /// A uid of the range that is not in `taken` and that no process of the host runs as;
    /// `None` when none is left.
    pub fn pick(&self, taken: &HashSet<u32>) -> Option<u32> {
        let busy = process_uids();
        let size = u64::from(self.last - self.first) + 1;
        let start = crate::ids::random_u64() % size;
        (0..size).map(|i| self.first + ((start + i) % size) as u32).find(|uid| !taken.contains(uid) && !busy.contains(uid))
    }
}

fn read(path: &str) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// The uids the host's processes run as (the owners of their `/proc` entries).
fn process_uids() -> HashSet<u32> {
    let Ok(dir) = fs::read_dir("/proc") else { return HashSet::new() };
    dir.flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_must_miss_subordinate_ids_users_and_groups() {
        let r = UidRange::new((200_000, 265_535));
        assert_eq!(r.check_free_in("alice:100000:65536\n", "", "root:x:0:0::/root:/bin/sh\n", "root:x:0:\n"), Ok(()));
        let sub = r.check_free_in("alice:165536:65536\n", "", "", "").unwrap_err();
        assert!(sub.contains("alice") && sub.contains("/etc/subuid") && sub.contains("--uid-range"), "{sub}");
        assert!(r.check_free_in("", "bob:265535:1\n", "", "").unwrap_err().contains("/etc/subgid"));
        let user = r.check_free_in("", "", "svc:x:200001:5::/:/bin/false\n", "").unwrap_err();
        assert!(user.contains("uid 200001 (svc)"), "{user}");
        assert!(r.check_free_in("", "", "", "grp:x:265535:\n").unwrap_err().contains("gid 265535"));
        // Comments and malformed lines are skipped.
        assert_eq!(r.check_free_in("# alice:200000:10\nbroken\n", "", "x\n", ""), Ok(()));
    }

    #[test]
    fn picks_skip_taken_uids_and_stay_in_range() {
        let r = UidRange::new((7_000_000, 7_000_002));
        let taken: HashSet<u32> = [7_000_000, 7_000_002].into_iter().collect();
        for _ in 0..20 {
            assert_eq!(r.pick(&taken), Some(7_000_001));
        }
        let all: HashSet<u32> = (7_000_000..=7_000_002).collect();
        assert_eq!(r.pick(&all), None);
    }
}
