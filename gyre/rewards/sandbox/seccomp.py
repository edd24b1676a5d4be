"""A seccomp-BPF filter for sandboxed programs: the system calls a program never needs are refused.

The namespaces already confine what these calls could reach; the filter removes kernel attack surface
(and a second line against a namespace escape): debugging other processes (ptrace, process_vm_*),
mounting and namespace changes (mount, pivot_root, unshare, setns, clone with CLONE_NEW* flags; clone3
is answered ENOSYS so the C library falls back to clone, whose flags a filter can read), kernel
keyrings, eBPF, perf events, userfaultfd, io_uring, module loading, kexec, reboot, swap, sockets of
any family but AF_UNIX, and memory the address-space limit does not count (System V shared memory,
message queues and semaphores, memfds). Refused calls fail with EPERM; the program keeps running. A system call made
through another architecture's entry point (x86's int 0x80, x32) kills the program outright: its
numbers would not mean what this table says.

The filter is built here, in the supervisor, as bytes; ``nsinit`` installs it with ``prctl`` just
before ``execve``. Reference: Linux ``Documentation/userspace-api/seccomp_filter.rst``.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data offsets and BPF opcodes (linux/filter.h, linux/seccomp.h)
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000

_ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000
_AF_UNIX = 1
_CLONE_NEW = 0x7E020080  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}

# Refused system calls, by name, with their numbers on x86_64 and aarch64 (asm/unistd*.h).
_DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "unshare": (272, 97), "setns": (308, 268), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "syslog": (103, 116), "acct": (163, 89), "quotactl": (179, 60),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "fanotify_init": (300, 262),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    # memory that RLIMIT_AS does not count: System V shared memory, message queues, semaphores, memfds
    "shmget": (29, 194), "shmat": (30, 196), "msgget": (68, 186), "msgsnd": (69, 189), "semget": (64, 190),
    "memfd_create": (319, 279), "memfd_secret": (447, 447),
}
_CLONE, _CLONE3, _SOCKET = (56, 220), (435, 435), (41, 198)


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def supported() -> bool:
    return platform.machine() in _ARCHES


def build_filter(machine: str | None = None) -> bytes:
    """The filter program for ``machine`` (default: this one) as packed ``struct sock_filter``s."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp syscall table for {machine}")
    col = 0 if machine == "x86_64" else 1
    deny_eperm = _ins(_RET_K, _RET_ERRNO | errno.EPERM)
    prog = [_ins(_LD_W_ABS, _ARCH), _ins(_JEQ_K, _ARCHES[machine], jt=1), _ins(_RET_K, _RET_KILL_PROCESS),
            _ins(_LD_W_ABS, _NR)]
    if machine == "x86_64":  # the x32 ABI reuses the same arch value with this bit in the number
        prog += [_ins(_JGE_K, _X32_BIT, jf=1), _ins(_RET_K, _RET_KILL_PROCESS)]
    for numbers in _DENIED.values():
        prog += [_ins(_JEQ_K, numbers[col], jf=1), deny_eperm]
    prog += [_ins(_JEQ_K, _CLONE3[col], jf=1), _ins(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    # clone: refuse namespace flags in its first argument (the low 32 bits hold every CLONE_NEW* flag)
    prog += [_ins(_JEQ_K, _CLONE[col], jf=4), _ins(_LD_W_ABS, _ARG0), _ins(_JSET_K, _CLONE_NEW, jf=1), deny_eperm,
             _ins(_RET_K, _RET_ALLOW)]
    # socket: AF_UNIX only (socket pairs for asyncio); the network namespace has no interface anyway
    prog += [_ins(_JEQ_K, _SOCKET[col], jf=3), _ins(_LD_W_ABS, _ARG0), _ins(_JEQ_K, _AF_UNIX, jt=1), deny_eperm]
    prog += [_ins(_RET_K, _RET_ALLOW)]
    return b"".join(prog)
