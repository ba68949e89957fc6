//! The seccomp filter every replica runs under: a classic BPF program, handed to bubblewrap (`--seccomp FD`)
//! and loaded right before the replica's first instruction.
//!
//! It refuses what a container runtime's default profile refuses to an unprivileged container (the calls
//! that reach the kernel's global state or other processes): mounting and namespace changes, kernel
//! modules and kexec, keyrings, BPF, perf events, file handles (`open_by_handle_at` reads any file of a
//! bound file system), `ptrace` and cross-process memory access, clock and swap changes, reboot, quotas,
//! `userfaultfd`, io_uring, terminal input injection (`TIOCSTI`), `personality` flags beyond the plain
//! ones (no turning address-space randomisation off), `memfd_secret` (memory the kernel hides from itself),
//! and two kinds of socket: `AF_VSOCK` (a way to the hypervisor or the host's VM sockets, not through the
//! sandbox's network) and netlink's kernel uevents (the host's device events). `clone` is allowed without namespace
//! flags only, and `clone3` answers ENOSYS so libc falls back to `clone` (whose flags a filter can read).
//! Calls of another architecture's ABI (32-bit x86, x32) kill the process: their numbers differ, so a
//! filter keyed on this ABI's numbers would not see them.
//!
//! Refused calls fail with EPERM, as they do without the capability; nothing else changes.

use linux_raw_sys::general as nr;

/// `struct sock_filter`, as the kernel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JSET: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const RET: u16 = 0x06; // BPF_RET | BPF_K

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// Offsets into `struct seccomp_data`: nr, arch, then the arguments (u64 each; the low half first on the
/// little-endian machines we build for).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x32 system calls carry this bit on x86_64.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Every namespace flag `clone` takes (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
const CLONE_NAMESPACES: u32 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;

/// The `personality` values a container may set (Linux itself, 32-bit `uname`, `UNAME26`, and the query
/// `0xffffffff`); others, such as turning address-space randomisation off, are refused.
const PERSONALITIES: &[u32] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Socket families and protocols refused: `AF_VSOCK`, and `AF_NETLINK` with `NETLINK_KOBJECT_UEVENT`.
const AF_VSOCK: u32 = 40;
const AF_NETLINK: u32 = 16;
const NETLINK_KOBJECT_UEVENT: u32 = 15;

/// ioctls that push input into a terminal (a sandbox holding a tty of the host could type into it).
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;

/// The calls refused with EPERM, on every architecture we build for.
const DENIED: &[u32] = &[
    nr::__NR_acct,
    nr::__NR_add_key,
    nr::__NR_bpf,
    nr::__NR_clock_adjtime,
    nr::__NR_clock_settime,
    nr::__NR_delete_module,
    nr::__NR_fanotify_init,
    nr::__NR_finit_module,
    nr::__NR_fsconfig,
    nr::__NR_fsmount,
    nr::__NR_fsopen,
    nr::__NR_fspick,
    nr::__NR_init_module,
    nr::__NR_io_uring_enter,
    nr::__NR_io_uring_register,
    nr::__NR_io_uring_setup,
    nr::__NR_kcmp,
    nr::__NR_kexec_file_load,
    nr::__NR_kexec_load,
    nr::__NR_keyctl,
    nr::__NR_lookup_dcookie,
    nr::__NR_mbind,
    nr::__NR_memfd_secret,
    nr::__NR_migrate_pages,
    nr::__NR_mount,
    nr::__NR_mount_setattr,
    nr::__NR_move_mount,
    nr::__NR_move_pages,
    nr::__NR_name_to_handle_at,
    nr::__NR_nfsservctl,
    nr::__NR_open_by_handle_at,
    nr::__NR_open_tree,
    nr::__NR_perf_event_open,
    nr::__NR_pidfd_getfd,
    nr::__NR_pivot_root,
    nr::__NR_process_vm_readv,
    nr::__NR_process_vm_writev,
    nr::__NR_ptrace,
    nr::__NR_quotactl,
    nr::__NR_quotactl_fd,
    nr::__NR_reboot,
    nr::__NR_request_key,
    nr::__NR_set_mempolicy,
    nr::__NR_set_mempolicy_home_node,
    nr::__NR_setns,
    nr::__NR_settimeofday,
    nr::__NR_swapoff,
    nr::__NR_swapon,
    nr::__NR_syslog,
    nr::__NR_umount2,
    nr::__NR_unshare,
    nr::__NR_userfaultfd,
    nr::__NR_vhangup,
];

/// Calls only the x86_64 ABI has.
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: &[u32] = &[
    nr::__NR_create_module,
    nr::__NR_get_kernel_syms,
    nr::__NR_query_module,
    nr::__NR_iopl,
    nr::__NR_ioperm,
    nr::__NR__sysctl,
    nr::__NR_sysfs,
    nr::__NR_uselib,
    nr::__NR_ustat,
    nr::__NR_modify_ldt,
];
#[cfg(not(target_arch = "x86_64"))]
const DENIED_ARCH: &[u32] = &[];

/// Where a jump goes, resolved once the program is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum To {
    Next,
    Allow,
    Eperm,
    Enosys,
    Kill,
    CloneCheck,
    IoctlCheck,
    PersonalityCheck,
    SocketCheck,
}

struct Asm {
    code: Vec<(u16, To, To, u32)>,
    labels: Vec<(To, usize)>,
}

impl Asm {
    fn op(&mut self, code: u16, jt: To, jf: To, k: u32) {
        self.code.push((code, jt, jf, k));
    }
    fn label(&mut self, l: To) {
        self.labels.push((l, self.code.len()));
    }
    fn resolve(self) -> Vec<Insn> {
        let at = |l: To| self.labels.iter().find(|(x, _)| *x == l).map(|(_, i)| *i);
        self.code
            .iter()
            .enumerate()
            .map(|(i, &(code, jt, jf, k))| {
                let rel = |t: To| -> u8 {
                    if t == To::Next {
                        return 0;
                    }
                    let target = at(t).expect("every jump target is laid out");
                    u8::try_from(target - i - 1).expect("the program is short enough for 8-bit jumps")
                };
                Insn { code, jt: rel(jt), jf: rel(jf), k }
            })
            .collect()
    }
}

fn program() -> Vec<Insn> {
    use To::*;
    let mut a = Asm { code: Vec::new(), labels: Vec::new() };
    // Another ABI: kill.
    a.op(LD_W_ABS, Next, Next, ARCH);
    a.op(JEQ, Next, Kill, AUDIT_ARCH);
    a.op(LD_W_ABS, Next, Next, NR);
    #[cfg(target_arch = "x86_64")]
    a.op(JGE, Eperm, Next, X32_SYSCALL_BIT);
    a.op(JEQ, Enosys, Next, nr::__NR_clone3);
    a.op(JEQ, CloneCheck, Next, nr::__NR_clone);
    a.op(JEQ, IoctlCheck, Next, nr::__NR_ioctl);
    a.op(JEQ, PersonalityCheck, Next, nr::__NR_personality);
    a.op(JEQ, SocketCheck, Next, nr::__NR_socket);
    for &n in DENIED.iter().chain(DENIED_ARCH) {
        a.op(JEQ, Eperm, Next, n);
    }
    a.op(RET, Next, Next, RET_ALLOW);
    a.label(CloneCheck);
    a.op(LD_W_ABS, Next, Next, arg_low(0));
    a.op(JSET, Eperm, Allow, CLONE_NAMESPACES);
    a.label(IoctlCheck);
    a.op(LD_W_ABS, Next, Next, arg_low(1));
    a.op(JEQ, Eperm, Next, TIOCSTI);
    a.op(JEQ, Eperm, Next, TIOCLINUX);
    a.op(RET, Next, Next, RET_ALLOW);
    a.label(PersonalityCheck);
    a.op(LD_W_ABS, Next, Next, arg_low(0));
    for &p in PERSONALITIES {
        a.op(JEQ, Allow, Next, p);
    }
    a.op(RET, Next, Next, RET_ERRNO | EPERM);
    a.label(SocketCheck);
    a.op(LD_W_ABS, Next, Next, arg_low(0));
    a.op(JEQ, Eperm, Next, AF_VSOCK);
    a.op(JEQ, Next, Allow, AF_NETLINK);
    a.op(LD_W_ABS, Next, Next, arg_low(2));
    a.op(JEQ, Eperm, Allow, NETLINK_KOBJECT_UEVENT);
    a.label(Allow);
    a.op(RET, Next, Next, RET_ALLOW);
    a.label(Eperm);
    a.op(RET, Next, Next, RET_ERRNO | EPERM);
    a.label(Enosys);
    a.op(RET, Next, Next, RET_ERRNO | ENOSYS);
    a.label(Kill);
    a.op(RET, Next, Next, RET_KILL_PROCESS);
    a.resolve()
}

/// The filter as bytes, in the layout `--seccomp FD` reads (an array of `struct sock_filter`).
pub fn filter_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    for i in program() {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions the filter uses, to check the program's answers.
    fn run(p: &[Insn], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for a in args {
            data.extend_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = p[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let o = i.k as usize;
                    acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
                }
                JEQ | JGE | JSET => {
                    let hit = match i.code {
                        JEQ => acc == i.k,
                        JGE => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if hit { i.jt } else { i.jf });
                }
                RET => return i.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn verdict(nr: u32, args: [u64; 6]) -> u32 {
        run(&program(), AUDIT_ARCH, nr, args)
    }

    #[test]
    fn refuses_vsock_and_uevent_sockets_and_allows_the_others() {
        let sock =
            |domain: u64, kind: u64, proto: u64| verdict(nr::__NR_socket, [domain, kind, proto, 0, 0, 0]);
        assert_eq!(sock(40, 1, 0), RET_ERRNO | EPERM, "AF_VSOCK");
        assert_eq!(sock(16, 3, 15), RET_ERRNO | EPERM, "a netlink uevent socket");
        assert_eq!(sock(16, 3, 0), RET_ALLOW, "netlink route (ip, getaddrinfo)");
        assert_eq!(sock(2, 1, 0), RET_ALLOW, "AF_INET");
        assert_eq!(sock(10, 2, 0), RET_ALLOW, "AF_INET6");
        assert_eq!(sock(1, 1, 0), RET_ALLOW, "AF_UNIX");
        assert_eq!(verdict(nr::__NR_memfd_secret, [0; 6]), RET_ERRNO | EPERM);
        assert_eq!(verdict(nr::__NR_memfd_create, [0; 6]), RET_ALLOW);
    }

    #[test]
    fn refuses_what_reaches_the_kernel_or_other_processes() {
        for n in [nr::__NR_mount, nr::__NR_open_by_handle_at, nr::__NR_keyctl, nr::__NR_bpf, nr::__NR_ptrace]
        {
            assert_eq!(verdict(n, [0; 6]), RET_ERRNO | EPERM, "syscall {n}");
        }
        for &n in DENIED.iter().chain(DENIED_ARCH) {
            assert_eq!(verdict(n, [0; 6]), RET_ERRNO | EPERM, "syscall {n}");
        }
    }

    #[test]
    fn allows_ordinary_calls() {
        for n in [nr::__NR_read, nr::__NR_write, nr::__NR_openat, nr::__NR_mmap, nr::__NR_socket] {
            assert_eq!(verdict(n, [0; 6]), RET_ALLOW, "syscall {n}");
        }
        assert_eq!(verdict(nr::__NR_ioctl, [1, 0x5401, 0, 0, 0, 0]), RET_ALLOW, "TCGETS");
    }

    #[test]
    fn clone_without_namespaces_only() {
        // A thread (CLONE_VM | CLONE_THREAD | ...) and a fork (SIGCHLD) pass; a new user or net ns does not.
        assert_eq!(verdict(nr::__NR_clone, [0x003d_0f00, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(verdict(nr::__NR_clone, [17, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(verdict(nr::__NR_clone, [0x1000_0000 | 17, 0, 0, 0, 0, 0]), RET_ERRNO | EPERM);
        assert_eq!(verdict(nr::__NR_clone, [0x4000_0000, 0, 0, 0, 0, 0]), RET_ERRNO | EPERM);
        assert_eq!(verdict(nr::__NR_clone3, [0; 6]), RET_ERRNO | ENOSYS);
    }

    #[test]
    fn personality_only_plain() {
        assert_eq!(verdict(nr::__NR_personality, [0xffff_ffff, 0, 0, 0, 0, 0]), RET_ALLOW, "query");
        assert_eq!(verdict(nr::__NR_personality, [0x8, 0, 0, 0, 0, 0]), RET_ALLOW, "PER_LINUX32");
        assert_eq!(
            verdict(nr::__NR_personality, [0x0040000, 0, 0, 0, 0, 0]),
            RET_ERRNO | EPERM,
            "ADDR_NO_RANDOMIZE"
        );
    }

    #[test]
    fn terminal_injection_and_other_abis() {
        assert_eq!(verdict(nr::__NR_ioctl, [0, u64::from(TIOCSTI), 0, 0, 0, 0]), RET_ERRNO | EPERM);
        assert_eq!(run(&program(), 0x4000_0003, nr::__NR_read, [0; 6]), RET_KILL_PROCESS, "i386");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(verdict(X32_SYSCALL_BIT | nr::__NR_mount, [0; 6]), RET_ERRNO | EPERM, "x32");
    }

    #[test]
    fn bytes_are_whole_instructions() {
        assert_eq!(filter_bytes().len(), program().len() * 8);
    }
}
