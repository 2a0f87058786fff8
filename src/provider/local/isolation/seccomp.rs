//! The seccomp filter every isolated sandbox process runs under, with `no_new_privs`.
//!
//! The init installs it on itself before it starts any thread or command, so every process of
//! the sandbox inherits it and none can remove it. It is a deny list: what agents run (shells,
//! compilers, interpreters, package managers, `strace` and `gdb` of the sandbox's own processes,
//! namespaces of their own) keeps working, and each denied call fails with `EPERM`:
//!
//! | call | why |
//! |---|---|
//! | `ioctl` `TIOCSTI`, `TIOCLINUX` | inject input into a terminal (a second wall behind the sandbox having no terminal of the host's) |
//! | `keyctl`, `add_key`, `request_key` | kernel keyrings are not namespaced: keys and quotas would be shared with other sandboxes |
//! | `bpf` | loads programs into the kernel: a large attack surface, no use inside |
//! | `perf_event_open` | kernel attack surface and side channels on other tenants |
//! | `userfaultfd` | widens the race windows kernel exploits rely on |
//! | `init_module`, `finit_module`, `delete_module` | kernel modules |
//! | `kexec_load`, `kexec_file_load` | replace the running kernel |
//! | `open_by_handle_at` | opens files by handle, around the mount namespace's view |
//! | `io_uring_setup`, `io_uring_enter`, `io_uring_register` | io_uring makes sockets and opens files in the kernel, where this filter never sees them |
//! | `socket` of a family other than unix, IPv4, IPv6, netlink and packet | `vsock` reaches the machine's hypervisor whatever the network namespace; the others are rarely used kernel surface |
//!
//! System calls of another architecture's ABI (32-bit calls on a 64-bit kernel) end the process:
//! they would go around the list.

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};
use std::collections::BTreeMap;

/// `ioctl` requests refused (from `<asm-generic/ioctls.h>`).
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

/// The names the deny list gives in results and docs, in the order of the table above.
pub const DENIED: &[&str] = &[
    "ioctl(TIOCSTI)",
    "ioctl(TIOCLINUX)",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "socket(other families)",
];

/// Socket families a sandbox may make: unix, IPv4, IPv6, netlink (`ip`, `ss`) and packet
/// (`tcpdump` in a network namespace of its own; it needs a capability the Landlock tier lacks).
const FAMILIES: [i32; 5] = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET];

fn target() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|_| format!("no seccomp filter is defined for {}", std::env::consts::ARCH))
}

/// The compiled filter.
fn program() -> Result<BpfProgram, String> {
    compile(false)
}

/// The filter of the Landlock tier: the same list, and, since that tier may share the host's
/// network stack and Landlock rules only TCP, `socket` refuses every IPv4 and IPv6 socket that is
/// not TCP (UDP, raw, SCTP, DCCP, MPTCP, ...).
pub(super) fn landlock_program() -> Result<BpfProgram, String> {
    compile(true)
}

/// Each variant compiled once per process (a Landlock-tier command would otherwise pay the
/// compilation at every start).
fn compile(inet_tcp_only: bool) -> Result<BpfProgram, String> {
    static COMPILED: [std::sync::OnceLock<Result<BpfProgram, String>>; 2] = [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    COMPILED[usize::from(inet_tcp_only)].get_or_init(|| build(inet_tcp_only)).clone()
}

fn build(inet_tcp_only: bool) -> Result<BpfProgram, String> {
    let whole: Vec<i64> = vec![
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_open_by_handle_at,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = whole.into_iter().map(|nr| (nr, Vec::new())).collect();
    let request = |value| {
        SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(|e| format!("build the seccomp rule: {e}"))
    };
    rules.insert(libc::SYS_ioctl, vec![request(TIOCSTI)?, request(TIOCLINUX)?]);
    let cond = |arg, op, value: i32| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value as u64).map_err(|e| format!("build the seccomp rule: {e}"))
    };
    let rule = |conds| SeccompRule::new(conds).map_err(|e| format!("build the seccomp rule: {e}"));
    // Each rule matches a `socket` call that is refused. The families between the allowed ones,
    // as ranges: below the first, each gap, above the last.
    let mut socket = Vec::new();
    let mut allowed = FAMILIES;
    allowed.sort_unstable();
    let mut next = 0;
    for family in allowed {
        if family > next {
            socket.push(rule(vec![cond(0, SeccompCmpOp::Ge, next)?, cond(0, SeccompCmpOp::Lt, family)?])?);
        }
        next = family + 1;
    }
    socket.push(rule(vec![cond(0, SeccompCmpOp::Ge, next)?])?);
    if inet_tcp_only {
        for family in [libc::AF_INET, libc::AF_INET6] {
            // Every type but SOCK_STREAM, by the type's low bits (flags such as SOCK_CLOEXEC are
            // above them).
            for kind in (0..=0xf).filter(|k| *k != libc::SOCK_STREAM) {
                socket.push(rule(vec![cond(0, SeccompCmpOp::Eq, family)?, cond(1, SeccompCmpOp::MaskedEq(0xf), kind)?])?);
            }
            // A stream socket whose protocol is not 0 or TCP (SCTP's stream mode, MPTCP).
            socket.push(rule(vec![cond(0, SeccompCmpOp::Eq, family)?, cond(2, SeccompCmpOp::Gt, libc::IPPROTO_TCP)?])?);
        }
    }
    rules.insert(libc::SYS_socket, socket);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), target()?)
        .map_err(|e| format!("build the seccomp filter: {e}"))?;
    BpfProgram::try_from(filter).map_err(|e| format!("compile the seccomp filter: {e}"))
}

/// Sets `no_new_privs` and installs the filter on the calling thread (and so on everything it
/// starts from now on). Call it before the process starts other threads.
pub(super) fn install() -> Result<(), String> {
    let program = program()?;
    seccompiler::apply_filter(&program).map_err(|e| format!("install the seccomp filter: {e}"))
}

/// The internal subcommand that installs the filter, then becomes the program named after it: how
/// a command entered with `nsenter`, which does not descend from the init, gets the filter too
/// (it holds through `nsenter`'s `setns` and every exec after).
pub const FILTER_SUBCOMMAND: &str = "sandbox-filter";

/// The body of `sandbox-mcp sandbox-filter PROGRAM ARGS...`; returns only when it fails.
pub fn run_filtered(args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let [program, rest @ ..] = args else { anyhow::bail!("usage: {FILTER_SUBCOMMAND} PROGRAM ARGS...") };
    install().map_err(anyhow::Error::msg)?;
    let err = std::process::Command::new(program).args(rest).exec();
    anyhow::bail!("could not run {program}: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_this_machine() {
        let program = program().unwrap();
        assert!(!program.is_empty());
        assert!(landlock_program().unwrap().len() > program.len());
        assert_eq!(DENIED.len(), 18);
    }
}
