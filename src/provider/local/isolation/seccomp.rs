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
//! | `socketpair` of a family other than unix | the same families, by the other call that makes sockets |
//!
//! System calls of another architecture's ABI (32-bit calls on a 64-bit kernel) end the process,
//! and on x86-64 calls of the x32 ABI (the same architecture, numbers with bit 30 set) fail with
//! `ENOSYS`, as on a kernel built without it: both would go around the list, which names the
//! native numbers.

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};
use std::collections::BTreeMap;

/// `ioctl` requests refused (from `<asm-generic/ioctls.h>`).
const TIOCSTI: i32 = 0x5412;
const TIOCLINUX: i32 = 0x541C;

/// The bit that marks a system call of the x32 ABI on x86-64 (`__X32_SYSCALL_BIT`).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

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
    "socketpair(other families)",
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
    let cond = |arg, op, value: i32| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value as u64).map_err(|e| format!("build the seccomp rule: {e}"))
    };
    let rule = |conds| SeccompRule::new(conds).map_err(|e| format!("build the seccomp rule: {e}"));
    let request = |value| rule(vec![cond(1, SeccompCmpOp::Eq, value)?]);
    rules.insert(libc::SYS_ioctl, vec![request(TIOCSTI)?, request(TIOCLINUX)?]);
    // Only unix sockets come in pairs; a pair of any other family is refused like its `socket`.
    let pair = vec![rule(vec![cond(0, SeccompCmpOp::Lt, libc::AF_UNIX)?])?, rule(vec![cond(0, SeccompCmpOp::Gt, libc::AF_UNIX)?])?];
    rules.insert(libc::SYS_socketpair, pair);
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
    let program = BpfProgram::try_from(filter).map_err(|e| format!("compile the seccomp filter: {e}"))?;
    let program = if cfg!(target_arch = "x86_64") { [x32_guard().as_slice(), &program].concat() } else { program };
    // The kernel's limit (BPF_MAXINSNS); the filters are far below it (a few hundred).
    if program.len() > 4096 {
        return Err(format!("the seccomp filter has {} instructions, over the kernel's 4096", program.len()));
    }
    Ok(program)
}

/// Three instructions put before the compiled filter: load the call's number, and answer `ENOSYS`
/// when it has the x32 bit. The compiled filter checks the architecture, and x32 calls share
/// x86-64's, so without this they would reach the rules under numbers none of them names. Its
/// jumps are relative, so it runs unchanged after the guard.
fn x32_guard() -> Vec<seccompiler::sock_filter> {
    use seccompiler::sock_filter;
    const LOAD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS, offset 0 is seccomp_data.nr
    const JUMP_IF_AT_LEAST: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    vec![
        sock_filter { code: LOAD_NR, jt: 0, jf: 0, k: 0 },
        sock_filter { code: JUMP_IF_AT_LEAST, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
        sock_filter { code: RETURN, jt: 0, jf: 0, k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32 },
    ]
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
        assert_eq!(DENIED.len(), 19);
    }

    /// Runs a compiled filter on one call, as the kernel would: the subset of classic BPF the
    /// filter uses (loads from `seccomp_data`, `and`, jumps, returns).
    fn verdict(program: &[seccompiler::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            pc += 1;
            let k = i.k;
            match i.code {
                0x20 => acc = u32::from_ne_bytes(data[k as usize..k as usize + 4].try_into().unwrap()),
                0x54 => acc &= k,
                0x05 => pc += k as usize,
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match i.code {
                        0x15 => acc == k,
                        0x25 => acc > k,
                        0x35 => acc >= k,
                        _ => acc & k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                0x06 => return k,
                code => panic!("instruction {code:#x} is not modelled"),
            }
        }
    }

    #[test]
    fn the_filter_refuses_the_list_and_lets_the_rest_through() {
        let (normal, landlock) = (program().unwrap(), landlock_program().unwrap());
        let arch = match std::env::consts::ARCH {
            "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
            "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
            other => panic!("no audit arch for {other}"),
        };
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let allow = libc::SECCOMP_RET_ALLOW;
        let call = |p: &[seccompiler::sock_filter], nr: i64, args: [u64; 6]| verdict(p, arch, nr as u32, args);
        let (unix, inet, vsock, tipc) = (libc::AF_UNIX as u64, libc::AF_INET as u64, libc::AF_VSOCK as u64, libc::AF_TIPC as u64);
        let stream_cloexec = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
        for p in [&normal, &landlock] {
            assert_eq!(call(p, libc::SYS_keyctl, [0; 6]), eperm);
            assert_eq!(call(p, libc::SYS_io_uring_setup, [0; 6]), eperm);
            assert_eq!(call(p, libc::SYS_getpid, [0; 6]), allow);
            assert_eq!(call(p, libc::SYS_ioctl, [0, TIOCSTI as u64, 0, 0, 0, 0]), eperm);
            // TCGETS
            assert_eq!(call(p, libc::SYS_ioctl, [0, 0x5401, 0, 0, 0, 0]), allow);
            assert_eq!(call(p, libc::SYS_socket, [vsock, 1, 0, 0, 0, 0]), eperm);
            assert_eq!(call(p, libc::SYS_socket, [inet, stream_cloexec, 0, 0, 0, 0]), allow);
            assert_eq!(call(p, libc::SYS_socket, [unix, libc::SOCK_DGRAM as u64, 0, 0, 0, 0]), allow);
            // socketpair: unix pairs only.
            assert_eq!(call(p, libc::SYS_socketpair, [unix, stream_cloexec, 0, 0, 0, 0]), allow);
            assert_eq!(call(p, libc::SYS_socketpair, [tipc, libc::SOCK_SEQPACKET as u64, 0, 0, 0, 0]), eperm);
            assert_eq!(call(p, libc::SYS_socketpair, [vsock, 1, 0, 0, 0, 0]), eperm);
            assert_eq!(call(p, libc::SYS_socketpair, [0, 1, 0, 0, 0, 0]), eperm);
            // Another architecture's calls end the process.
            assert_eq!(verdict(p, 0x4000_0003, 20, [0; 6]), libc::SECCOMP_RET_KILL_PROCESS);
        }
        let dgram = libc::SOCK_DGRAM as u64;
        assert_eq!(call(&normal, libc::SYS_socket, [inet, dgram, 0, 0, 0, 0]), allow);
        assert_eq!(call(&landlock, libc::SYS_socket, [inet, dgram, 0, 0, 0, 0]), eperm);
        assert_eq!(call(&landlock, libc::SYS_socket, [inet, stream_cloexec, libc::IPPROTO_TCP as u64, 0, 0, 0]), allow);
        assert_eq!(call(&landlock, libc::SYS_socket, [inet, stream_cloexec, 262, 0, 0, 0]), eperm);
        if cfg!(target_arch = "x86_64") {
            // x32 calls (same architecture, bit 30 set) would otherwise pass under numbers no
            // rule names: keyctl is 250 in both ABIs.
            let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
            for p in [&normal, &landlock] {
                assert_eq!(verdict(p, arch, X32_SYSCALL_BIT | 250, [0; 6]), enosys);
                assert_eq!(verdict(p, arch, X32_SYSCALL_BIT | libc::SYS_getpid as u32, [0; 6]), enosys);
            }
        }
    }
}
