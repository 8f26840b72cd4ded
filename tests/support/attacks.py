"""Attack code run inside the sandbox by the security tests (plain Python source)."""
from __future__ import annotations

import os
import textwrap


def pg_write(socket_path: str | None, host: str | None, database: str, table: str,
             port: int = 5432) -> str:
    """Python source that talks Postgres' wire protocol (trust auth, as the machine's
    Postgres allows) over a Unix socket or TCP and creates `table` in `database` (a write
    that does not depend on the schema). Prints "written" if the server did it, else how
    it was stopped."""
    return textwrap.dedent(f"""
        import socket, struct
        def msg(kind, body):
            return kind + struct.pack("!I", len(body) + 4) + body
        try:
            if {socket_path!r}:
                s = socket.socket(socket.AF_UNIX)
                s.connect({socket_path!r})
            else:
                s = socket.create_connection(({host!r}, {port}), timeout=5)
            params = b"user\\0postgres\\0database\\0" + {database!r}.encode() + b"\\0\\0"
            body = struct.pack("!I", 196608) + params
            s.sendall(struct.pack("!I", len(body) + 4) + body)
            sql = "CREATE TABLE {table} (i int)"
            s.sendall(msg(b"Q", sql.encode() + b"\\0"))
            seen = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                seen += chunk
                if b"CREATE TABLE" in seen or b"ERROR" in seen or b"FATAL" in seen:
                    break
            print("written" if b"CREATE TABLE" in seen else "refused: " + repr(seen[-200:]))
        except OSError as exc:
            print("blocked:", type(exc).__name__, exc.errno)
    """)


SYSCALLS = {
    # x86-64 and the generic table (aarch64 and the others)
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "pidfd_open": 434, "pidfd_getfd": 438,
               "io_uring_setup": 425, "keyctl": 250, "add_key": 248, "bpf": 321,
               "perf_event_open": 298, "userfaultfd": 323, "unshare": 272, "mount": 165,
               "memfd_create": 319},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "pidfd_open": 434, "pidfd_getfd": 438,
                "io_uring_setup": 425, "keyctl": 219, "add_key": 217, "bpf": 280,
                "perf_event_open": 241, "userfaultfd": 282, "unshare": 97, "mount": 40,
                "memfd_create": 279},
}[os.uname().machine]
"""System call numbers the attacks call through libc's syscall() (Python has no wrapper)."""

SUPERVISOR_ATTACK = textwrap.dedent(f"""
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    NR = {SYSCALLS!r}
    sup = os.getppid()
    def err():
        return os.strerror(ctypes.get_errno())
    fd = libc.syscall(NR["pidfd_open"], sup, 0)
    print("pidfd_open", "ok" if fd >= 0 else err())
    got = [n for n in range(64) if libc.syscall(NR["pidfd_getfd"], fd, n, 0) >= 0]
    print("pidfd_getfd", got or err())
    opened = []
    for n in range(64):
        try:
            opened.append(os.open(f"/proc/{{sup}}/fd/{{n}}", os.O_WRONLY))
        except OSError as exc:
            last = exc.strerror
    print("proc_fd", opened or last)
    forged = (json.dumps({{"exit_code": 0, "cpu_s": 0, "memory_error": False}}) + "\\n")
    for n in opened:
        try:
            os.write(n, forged.encode())
        except OSError:
            pass
    print("ptrace", "ok" if libc.ptrace(16, sup, 0, 0) == 0 else err())
    local = (ctypes.c_char * 8)()
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(local), 8)
    print("process_vm_readv",
          "ok" if libc.syscall(NR["process_vm_readv"], sup, iov, 1, iov, 1, 0) >= 0
          else err())
    raise SystemExit(3)
""")
"""The attack of issue 30 on the supervisor (the code's parent): copy its descriptors
(pidfd_getfd, or its /proc/<pid>/fd) and write a report of our own on its status channel,
ptrace it, read its memory. Prints one line a way, `<way> <outcome>`, and exits 3."""
SUPERVISOR_ATTACK_REFUSED = {"pidfd_open": "Operation not permitted",
                             "pidfd_getfd": "Operation not permitted",
                             "proc_fd": "Permission denied",
                             "ptrace": "Operation not permitted",
                             "process_vm_readv": "Operation not permitted"}
"""SUPERVISOR_ATTACK's lines when every way is closed."""

FLOOD_STDOUT = textwrap.dedent("""
    import os
    chunk = b"y" * 2 ** 20
    for _ in range(300):
        os.write(1, chunk)
    print("all written")
""")
"""300 MiB on stdout (issue 30: it grew a tools-slow process by 890 MiB)."""

HOLD_640_MIB = textwrap.dedent("""
    import errno, os
    MIB, held = 2 ** 20, 0
    chunk = b"x" * MIB
    def hold(make):
        global held
        try:
            while held < 640 * MIB:
                fd = make()
                for _ in range(16):
                    os.write(fd, chunk)
                    held += MIB
                print("held", held // MIB, flush=True)
        except OSError as exc:
            print("stopped", errno.errorcode[exc.errno], flush=True)
    n = iter(range(10 ** 6))
    hold(lambda: os.memfd_create("x"))
    hold(lambda: os.open(f"/dev/shm/{next(n)}", os.O_RDWR | os.O_CREAT))
    hold(lambda: os.open(f"/tmp/{next(n)}", os.O_RDWR | os.O_CREAT))
    hold(lambda: os.open(f"{next(n)}", os.O_RDWR | os.O_CREAT))
    print("survived", held // MIB, flush=True)
""")
"""Issue 30: 640 MiB held against a 256 MiB limit through memfd and /dev's tmpfs. Each way
(memfd, /dev/shm, /tmp, the scratch directory) is tried in turn until 640 MiB are held in
all, in files of 16 MiB (the file-size limit) written with write(), never mapped (RLIMIT_AS
never sees them). Says what it holds as it goes (`held N`, `stopped ERRNO`, `survived N`,
in MiB): held_mib() reads it."""


def held_mib(stdout: str) -> int:
    """The most HOLD_640_MIB said it held, in MiB (0 if it said nothing)."""
    return max((int(line.split()[1]) for line in stdout.splitlines()
                if line.startswith(("held", "survived"))), default=0)


SPINNERS = 9
SPIN = textwrap.dedent(f"""
    import os, time
    def spin(i):
        with open(f"cpu-{{i}}", "w") as f:
            last = 0.0
            while True:
                now = time.process_time()
                if now - last > 0.02:
                    f.seek(0); f.write("%.3f " % now); f.flush()
                    last = now
    for i in range({SPINNERS - 1}):
        if os.fork() == 0:
            spin(i)
    spin({SPINNERS - 1})
""")
"""SPINNERS processes spinning, each writing its own CPU time (the kernel's count,
CLOCK_PROCESS_CPUTIME_ID) to its own file: their sum is what the run used, by its own
count."""

FORK_BOMB = textwrap.dedent("""
    import errno, os, time
    made = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            made += 1
    except OSError as exc:
        print(made, errno.errorcode[exc.errno], flush=True)
    os._exit(0)
""")
"""Forks sleepers until fork fails; prints how many it made and the error."""

FOUR_TIMES_200_MIB = textwrap.dedent("""
    import os, time
    for _ in range(4):
        if os.fork() == 0:
            b = bytearray(200 * 2 ** 20)
            for i in range(0, len(b), 4096):
                b[i] = 1
            print("filled", flush=True)
            time.sleep(60)
            os._exit(0)
    time.sleep(60)
""")
"""Four processes of 200 MiB each, each under a 256 MiB RLIMIT_AS."""
