"""The programs that run inside a sandbox (`agentq.tools.sandbox`): stdlib only, passed to
bwrap's Python with `-c` and to the code's interpreter on its command line."""

# Runs inside the sandbox (stdlib only; argv: config JSON, user code). Reports
# {"started": true} on the status fd, applies the limits, runs the user's code in a fresh
# interpreter and reports {"exit_code", "cpu_s", "memory_error"}; then exits the same way.
SUPERVISOR = r'''
import json, os, resource, signal, sys, time
cfg = json.loads(sys.argv[1])
status = cfg["status_fd"]
def report(**fields):
    try:
        os.write(status, json.dumps(fields).encode() + b"\n")
    except OSError:
        pass
report(started=True)
import ctypes
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
    report(error=f"prctl(PR_SET_DUMPABLE): {os.strerror(ctypes.get_errno())}")
    os._exit(1)
try:
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
except (OSError, ValueError) as exc:
    report(error=f"cannot apply the limits: {exc}")
    os._exit(1)
mem_r, mem_w = os.pipe()
try:
    pid = os.fork()
except OSError as exc:
    report(error=f"fork: {exc}")
    os._exit(1)
if pid == 0:
    os.close(status)
    os.close(mem_r)
    os.set_inheritable(mem_w, True)
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-c", cfg["wrapper"],
                                  str(mem_w), sys.argv[2]])
    except OSError as exc:
        os.write(2, f"sandbox: cannot start python: {exc}\n".encode())
        os._exit(127)
os.close(mem_w)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
_, st, usage = os.wait4(pid, 0)
def end_the_rest(give_up_s=5.0):
    # What the code left running (a grandchild in a session of its own) is killed now and
    # waited for, so that nothing of the run outlives its answer. bwrap's pid 1 kills them
    # as the namespace ends, but bwrap outside returns as soon as we exit: our caller was
    # told the run was over while they could still write to the scratch directory.
    # kill(-1) reaches every process of this pid namespace but pid 1 and us.
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        return
    me, until = os.getpid(), time.monotonic() + give_up_s
    while time.monotonic() < until:  # pid 1 reaps them; bounded, the wall limit is outside
        if not any(p.isdigit() and int(p) not in (1, me) for p in os.listdir("/proc")):
            return
        time.sleep(0.005)
end_the_rest()
os.set_blocking(mem_r, False)
try:
    memory_error = os.read(mem_r, 1) == b"M"
except OSError:
    memory_error = False
report(exit_code=os.waitstatus_to_exitcode(st), cpu_s=usage.ru_utime + usage.ru_stime,
       memory_error=memory_error)
if os.WIFSIGNALED(st):
    sig = os.WTERMSIG(st)
    try:
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)
os._exit(os.waitstatus_to_exitcode(st))
'''

# The user's process: runs the code as `python -c` would, and tells the supervisor (one byte
# on its pipe) when the code died of an uncaught MemoryError (the RLIMIT_AS cap).
WRAPPER = r'''
import os, sys
_fd, _code = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:]
def _hook(kind, value, tb, _fd=_fd, _os=os, _sys=sys):
    if issubclass(kind, MemoryError):
        try:
            _os.write(_fd, b"M")
        except OSError:
            pass
    if tb is not None:
        tb = tb.tb_next
        value = value.with_traceback(tb)
    _sys.__excepthook__(kind, value, tb)
sys.excepthook = _hook
del os, sys, _hook
exec(compile(_code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''
