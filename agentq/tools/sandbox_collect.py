"""Watching a running sandbox (`agentq.tools.sandbox`): its stdout, stderr and status lines
read as they come, its CPU time and memory metered, and the sandbox killed at the wall
deadline or past its CPU, memory, output or status budget."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Iterator

from agentq.tools.sandbox_meter import Meter
from agentq.tools.sandbox_output import Capture

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 65536
POLL_INTERVAL_S = 0.05
DRAIN_GRACE_S = 0.5
"""After the sandbox is gone, how long to wait for pipes (nothing should still hold them)."""
REAP_TIMEOUT_S = 5
STATUS_MAX_BYTES = 4096
"""The supervisor writes two short lines; more on the status channel is not it: the run is
killed and what came is ignored."""
OUTPUT_KILL_BYTES = 64 * 1024 * 1024
"""stdout and stderr together: past this the run is killed (its answer keeps the start)."""
METER_INTERVAL_S = 0.05


@dataclass
class Child:
    """The bwrap process (its own session): killing it ends the sandbox's pid namespace."""
    proc: subprocess.Popen
    exit_code: int | None = None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def reap(self, block: bool = True) -> bool:
        give_up = time.monotonic() + REAP_TIMEOUT_S
        while self.exit_code is None:
            try:
                pid, status = os.waitpid(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                self.exit_code = self.proc.returncode = -1
                break
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.exit_code
                break
            if not block:
                return False
            if time.monotonic() > give_up:
                log.error("sandbox child not reaped", extra={"pid": self.proc.pid})
                return False
            time.sleep(0.01)
        return True


@dataclass
class Ended:
    """How the collection ended: the wall deadline, or the run killed by us for its CPU
    budget, its memory, its output or a flooded status channel."""
    timed_out: bool = False
    cpu_limited: bool = False
    memory_limited: bool = False
    output_limited: bool = False
    status_overflow: bool = False
    run_cpu_s: float = 0.0

    @property
    def killed(self) -> bool:
        return (self.cpu_limited or self.memory_limited or self.output_limited
                or self.status_overflow)


def collect(child: Child, status_fd: int, reports: list[dict[str, Any]], deadline: float,
             max_chars: int, meter: Meter | None,
             cpu_budget_s: float) -> tuple[dict[str, Capture], Ended]:
    """Read the pipes and the status lines until EOF and bwrap's exit; kill the sandbox at
    the wall deadline, when the whole run's CPU time passes `cpu_budget_s` or its memory
    its limit (`meter`), past OUTPUT_KILL_BYTES of output or STATUS_MAX_BYTES of status."""
    captures = {"stdout": Capture(max_chars), "stderr": Capture(max_chars)}
    status_data = bytearray()
    ended = Ended()
    stop_at: float | None = None
    next_sample = time.monotonic()

    def stop(now: float) -> None:
        nonlocal stop_at
        child.kill()
        if stop_at is None:
            stop_at = now + DRAIN_GRACE_S

    with selectors.DefaultSelector() as sel, exit_watch(child.proc.pid) as pidfd:
        for name in captures:
            pipe = getattr(child.proc, name)
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, name)
        os.set_blocking(status_fd, False)
        sel.register(status_fd, selectors.EVENT_READ, "status")
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        while True:
            now = time.monotonic()
            exited = child.reap(block=False)
            if exited and pidfd is not None and pidfd in sel.get_map():
                sel.unregister(pidfd)
            pipes_open = any(key.data != "exit" for key in sel.get_map().values())
            if exited and not pipes_open:
                break
            if meter is not None and stop_at is None and now >= next_sample:
                ended.run_cpu_s, over_memory = meter.sample()
                next_sample = now + METER_INTERVAL_S
                if ended.run_cpu_s >= cpu_budget_s:
                    ended.cpu_limited = True
                    stop(now)
                elif over_memory:
                    ended.memory_limited = True
                    stop(now)
            if stop_at is None and now >= deadline:
                ended.timed_out = not exited
                stop(now)
            elif stop_at is None and exited:
                stop_at = now + DRAIN_GRACE_S
            if stop_at is not None and now >= stop_at:
                break
            wait = max(0.0, (stop_at or deadline) - now)
            if pidfd is None:
                wait = min(wait, POLL_INTERVAL_S)
            if meter is not None and stop_at is None:
                wait = min(wait, max(0.0, next_sample - now))
            for key, _ in sel.select(wait):
                if key.data == "exit":
                    continue
                try:
                    chunk = os.read(key.fd, READ_CHUNK_BYTES)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "status":
                    room = STATUS_MAX_BYTES - len(status_data)
                    status_data += chunk[:max(room, 0)]
                    if len(chunk) > room and not ended.status_overflow:
                        ended.status_overflow = True  # not the supervisor's few lines
                        log.warning("sandbox status channel flooded; run killed")
                        stop(time.monotonic())
                else:
                    captures[key.data].feed(chunk)
                    if (captures["stdout"].total + captures["stderr"].total
                            > OUTPUT_KILL_BYTES and not ended.output_limited):
                        ended.output_limited = True
                        stop(time.monotonic())
    if ended.status_overflow:  # not the supervisor's few lines: nothing of it is believed
        return captures, ended
    for line in bytes(status_data).splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            reports.append(item)
    return captures, ended


@contextlib.contextmanager
def exit_watch(pid: int) -> Iterator[int | None]:
    """A pidfd that becomes readable when `pid` exits (Linux 5.3+), else None (we poll)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)
