"""Nodes on one machine: each a network namespace of its own, joined to the host by a veth
pair on a bridge, with a CPU quota of its own (a cgroup), so that an orchestrator and tool
workers started in it reach Postgres, the broker and the model server over a link that can
be cut, as on another machine (DESIGN 1.2).

    network = Network().create()          # a bridge with the host's address on it
    node = network.node(cpus=0.4)         # a namespace, a veth pair on the bridge, a cgroup
    subprocess.Popen(cmd, preexec_fn=node.enter)   # the process runs inside the node
    node.cut(); node.restore()            # the node's link down, and up again
    network.destroy()                     # every node, veth, namespace and cgroup removed

The services the nodes use must listen on `network.host_address` as well as loopback (the
lab's private Postgres, Redis, RabbitMQ and model server take it: `listen_also`); Postgres
must also let `network.subnet` in (pg_hba).

Root only (ip netns, veth, cgroups). Everything made is named after this process's pid
(`agentq-<pid>-…`, `aq<pid>…`); `create()` first removes what an earlier process that is
gone (killed before it could clean up) left, and an exit hook removes this process's own.
"""
from __future__ import annotations

import atexit
import ctypes
import ipaddress
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.support.stack import _pid_alive

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V1_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
CGROUP_V2 = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
SUBNETS = ipaddress.ip_network("10.213.0.0/16")
"""where a network's /24 is taken from (the first one no address of the host is in)"""

_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
"""Loaded here, in the parent: `enter` runs in a forked child before exec."""


class NetnsError(RuntimeError):
    """A node could not be set up; the message says which command failed and why."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def available() -> str | None:
    """None when nodes can be made here; else why not."""
    if os.geteuid() != 0:
        return "network namespaces, veth pairs and cgroups need root"
    if subprocess.run(["which", "ip"], capture_output=True).returncode != 0:
        return "no `ip` command (apt-get install -y iproute2)"
    if CpuGroup.kind() is None:
        return "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with +cpu)"
    return None


class CpuGroup:
    """A cgroup with a CPU quota (`cpus` CPUs' worth of time per period), cgroup v1's cpu
    controller (and cpuacct beside it, for the group's CPU time) or cgroup v2's cpu.max."""

    def __init__(self, name: str, cpus: float | None):
        self.name, self.cpus = name, cpus
        self.kind_ = self.kind()
        if self.kind_ == "v1":
            self.dirs = [CGROUP_V1_CPU / name] + (
                [CGROUP_V1_CPUACCT / name] if CGROUP_V1_CPUACCT.resolve()
                != CGROUP_V1_CPU.resolve() else [])
        else:
            self.dirs = [CGROUP_V2 / name]

    @staticmethod
    def kind() -> str | None:
        if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
            return "v1"
        try:
            if "cpu" in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
                return "v2"
        except OSError:
            pass
        return None

    def create(self) -> "CpuGroup":
        for d in self.dirs:
            d.mkdir(exist_ok=True)
        return self.limit(self.cpus)

    def limit(self, cpus: float | None) -> "CpuGroup":
        """The group's quota: `cpus` CPUs' worth of time per period (None: no limit)."""
        self.cpus = cpus
        quota = -1 if cpus is None else max(1000, int(cpus * CPU_PERIOD_US))
        if self.kind_ == "v1":
            (self.dirs[0] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (self.dirs[0] / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.dirs[0] / "cpu.max").write_text(
                f"{'max' if quota < 0 else quota} {CPU_PERIOD_US}")
        return self

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def cpu_s(self) -> float:
        """CPU seconds the group's processes used (the live and the exited)."""
        if self.kind_ == "v1":
            acct = self.dirs[-1] / "cpuacct.usage"
            return int(acct.read_text()) / 1e9
        for line in (self.dirs[0] / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec"):
                return int(line.split()[1]) / 1e6
        return 0.0

    def throttled_s(self) -> float:
        """Time the group's processes waited for quota."""
        for line in (self.dirs[0] / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":  # v1: nanoseconds
                return int(value) / 1e9
            if key == "throttled_usec":  # v2
                return int(value) / 1e6
        return 0.0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in Path(self.procs_files()[0]).read_text().split()]
        except OSError:
            return []

    def add(self, pids) -> None:
        """Move these processes in (their threads with them; their children made after
        follow them, those made before do not: list them too)."""
        for path in self.procs_files():
            for pid in pids:
                try:
                    Path(path).write_text(str(pid))
                except ProcessLookupError:  # gone meanwhile
                    pass

    def remove(self, kill: bool = True) -> None:
        """SIGKILL to whatever is left in it (processes this benchmark started; `kill`
        False: moved back to the root group instead, as a server only counted here), then
        the group removed."""
        for pid in self.pids():
            try:
                if kill:
                    os.kill(pid, signal.SIGKILL)
                else:
                    for d in self.dirs:
                        (d.parent / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                pass
        for d in self.dirs:
            deadline = time.monotonic() + 10
            while d.exists():
                try:
                    d.rmdir()
                except FileNotFoundError:
                    break
                except OSError:  # processes still exiting
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


class Node:
    """One namespace, its veth pair (the host's end on the network's bridge) and its cgroup."""

    def __init__(self, network: "Network", index: int, cpus: float | None):
        self.network, self.index = network, index
        self.name = f"{network.prefix}-n{index}"
        self.host_end = f"{network.short}h{index}"
        self.node_end = f"{network.short}n{index}"
        self.address = str(network.subnet[10 + index])
        self.cpu = CpuGroup(self.name, cpus)
        self._ns_path = str(NETNS_DIR / self.name)
        self._files = self.cpu.procs_files()

    def create(self) -> "Node":
        ip("netns", "add", self.name)
        ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.node_end,
           "netns", self.name)
        ip("link", "set", self.host_end, "master", self.network.bridge)
        ip("link", "set", self.host_end, "up")
        ip("-n", self.name, "addr", "add", f"{self.address}/{self.network.subnet.prefixlen}",
           "dev", self.node_end)
        ip("-n", self.name, "link", "set", "lo", "up")
        ip("-n", self.name, "link", "set", self.node_end, "up")
        self.cpu.create()
        return self

    def enter(self) -> None:
        """In a child between fork and exec (Popen's preexec_fn): into the node's cgroup
        and network namespace. Only what is safe there: writes and one system call."""
        pid = str(os.getpid()).encode()
        for path in self._files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        fd = os.open(self._ns_path, os.O_RDONLY)
        try:
            if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def cut(self) -> None:
        """The node's link down at the host's end (a cable pulled, a switch port dead): the
        node's packets go nowhere and nothing answers it; its connections are not closed,
        they wait, as across a real partition."""
        ip("link", "set", self.host_end, "down")

    def restore(self) -> None:
        ip("link", "set", self.host_end, "up")

    def reaches(self, port: int, timeout_s: float = 2.0) -> bool:
        """Whether a TCP connection from inside the node to the host's `port` opens."""
        probe = ("import socket,sys\n"
                 "try:\n"
                 f"    socket.create_connection(('{self.network.host_address}', {port}),"
                 f" timeout={timeout_s}).close()\n"
                 "except OSError:\n"
                 "    sys.exit(1)\n")
        return subprocess.run(["ip", "netns", "exec", self.name, "python3", "-c", probe],
                              capture_output=True, timeout=timeout_s + 30).returncode == 0

    def destroy(self) -> None:
        """The cgroup (what runs in it killed), the veth pair and the namespace: the link
        and the namespace go even when the cgroup could not be removed."""
        try:
            self.cpu.remove()
        finally:
            ip("link", "del", self.host_end, check=False)  # its peer goes with it
            ip("netns", "del", self.name, check=False)


class Network:
    """A bridge with the host's address on a /24 of its own; nodes join it."""

    def __init__(self):
        pid = os.getpid()
        self.prefix = f"agentq-{pid}"
        self.short = f"aq{pid}"  # interface names: at most 15 characters
        self.bridge = f"{self.short}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.host_address = ""
        self.nodes: list[Node] = []
        self.counted: list[CpuGroup] = []
        self._created = False

    def create(self) -> "Network":
        why = available()
        if why:
            raise NetnsError(why)
        remove_left_behind()
        self.subnet = self._free_subnet()
        self.host_address = str(self.subnet[1])
        atexit.register(self.destroy)
        self._created = True
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        return self

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        used = [ipaddress.ip_interface(a).network for a in
                re.findall(r"inet (\S+)", ip("-4", "addr").stdout)]
        for subnet in SUBNETS.subnets(new_prefix=24):
            if not any(subnet.overlaps(u) for u in used):
                return subnet
        raise NetnsError(f"no free /24 in {SUBNETS}")

    def node(self, cpus: float | None = None) -> Node:
        """A new node on the network; `cpus`: its CPU quota (None: no limit)."""
        node = Node(self, len(self.nodes) + 1, cpus)
        self.nodes.append(node)
        try:
            node.create()
        except Exception:
            node.destroy()
            self.nodes.remove(node)
            raise
        return node

    def count(self, name: str, pids) -> CpuGroup:
        """A cgroup without a quota that these processes (a shared server: Postgres and its
        children, the broker) are moved into, for their CPU time (`cpu_s()`), that of
        children that ended included."""
        group = CpuGroup(f"{self.prefix}-{name}", None).create()
        self.counted.append(group)
        group.add(pids)
        return group

    def destroy(self) -> None:
        """Every node (what still runs in its cgroup is killed), the counting groups (what
        is left in them moved back), then the bridge; one that cannot be removed does not
        keep the others: the first such error is raised once all were tried."""
        errors: list[Exception] = []
        parts = [node.destroy for node in reversed(self.nodes)] + \
            [lambda g=group: g.remove(kill=False) for group in reversed(self.counted)]
        self.nodes, self.counted = [], []
        for remove in parts:
            try:
                remove()
            except Exception as exc:  # noqa: BLE001 - raised below, after the others
                errors.append(exc)
        if self._created:
            ip("link", "del", self.bridge, check=False)
            self._created = False
        if errors:
            raise errors[0]


def remove_left_behind() -> int:
    """What processes that are gone left (namespaces, veths, bridges, cgroups named
    `agentq-<pid>-…` / `aq<pid>…`); how many things were removed."""
    removed = 0
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(r"agentq-(\d+)-n\d+", name)
        if m and not _pid_alive(int(m.group(1))):
            ip("netns", "del", name, check=False)
            removed += 1
    for name in re.findall(r"^\d+: (aq\d+(?:br|h\d+))[@:]", ip("-o", "link").stdout, re.M):
        if not _pid_alive(int(re.match(r"aq(\d+)", name).group(1))):
            ip("link", "del", name, check=False)
            removed += 1
    roots = [CGROUP_V1_CPU, CGROUP_V1_CPUACCT] if CpuGroup.kind() == "v1" else [CGROUP_V2]
    for root in roots:
        for d in root.glob("agentq-*-*"):
            m = re.fullmatch(r"agentq-(\d+)-(n\d+|[a-z]+)", d.name)
            if m and not _pid_alive(int(m.group(1))):
                group = CpuGroup(d.name, None)
                group.dirs = [d]
                group.remove(kill=m.group(2).startswith("n"))
                removed += 1
    return removed


NODE_READY_TIMEOUT_S = 300
"""How long a node's workers may take to start (a loaded machine: minutes)."""
NODE_URLS = ("AGENTQ_DATABASE_URL", "AGENTQ_BROKER_URL", "AGENTQ_RESULT_BACKEND_URL",
             "OPENAI_BASE_URL")
"""The addresses a node's processes reach the shared tier by: the lab's, with the host's
address on the nodes' network in place of loopback."""


def node_env(env: dict[str, str], host_address: str) -> dict[str, str]:
    """A lab stack's AGENTQ_/OPENAI_ settings as a node sees them (`NODE_URLS` pointed at
    `host_address` instead of 127.0.0.1)."""
    out = {k: v for k, v in env.items() if k.startswith(("AGENTQ_", "OPENAI_"))
           and k not in ("AGENTQ_HOME", "AGENTQ_TEST_SCRATCH")}  # a node's disk is its own
    for key in NODE_URLS:
        if out.get(key):
            out[key] = re.sub(r"(?<=[@/])127\.0\.0\.1(?=[:/])", host_address, out[key])
    return out


def node_stack(node: Node, env: dict[str, str], scratch: Path,
               workers=("orchestrator", "tools")):
    """The processes of one node (by default an orchestrator and a tools worker, no web, no
    beat) started inside `node` with the lab's settings `env` (node_env); its workers are
    named after the node (`agentq-<pid>-n1-orchestrator@host`). Not started yet."""
    from tests.support.stack import Stack, die_with_parent

    class NodeStack(Stack):
        # a node starts after the host's processes, on a machine they already load
        ready_timeout_s = NODE_READY_TIMEOUT_S

        def preexec(self) -> None:
            die_with_parent()
            node.enter()

        def commands(self) -> dict[str, list[str]]:
            return {kind: [self.agentq_bin(), "worker", kind, "-n", f"{node.name}-{kind}@%h"]
                    for kind in self.workers}

    settings = node_env(env, node.network.host_address)
    scratch.mkdir(parents=True, exist_ok=True)
    return NodeStack(settings["AGENTQ_DATABASE_URL"], settings["OPENAI_BASE_URL"], scratch,
                     settings, workers=workers, beat=False, web=False)
