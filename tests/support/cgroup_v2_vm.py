"""A virtual machine whose kernel runs cgroup v2 alone, to run the code sandbox's per-run
cgroups for real (issue 30) on a host whose memory/pids/cpu controllers are bound to cgroup
v1 (this one: `cat /proc/self/cgroup`), where they cannot be delegated.

The machine boots Debian's kernel (`linux-image-amd64`) in QEMU (`qemu-system-x86`), under
KVM where the CPU has hardware virtualization, else QEMU's emulator (accelerator()), with a
small initramfs of our own: busybox (`busybox-static`), the kernel's virtio, 9p and
overlayfs modules, and an /init that

  * mounts this host's root read-only over 9p (virtio), under a tmpfs overlay, so the
    project's checkout, its venv, /usr's Python and bubblewrap are all there, as they are
    here, and nothing the machine does writes to this host;
  * mounts a fresh /proc, /sys, /dev, /run, and cgroup2 alone at /sys/fs/cgroup
    (`cgroup_no_v1=all`: every controller is v2's); /tmp is this host's, under the overlay
    like the rest (a checkout there, as CI's may be, is seen; what the machine writes stays
    in its memory);
  * sets up the delegation a service manager would (systemd's `Delegate=yes`): the root
    group hands memory, pids and cpu to `agentq.service`, which the command runs in, as
    root, so the worker's own set-up (agentq.tools.cgroups.setup) has to make its leaf;
  * makes the new root the root (switch_root) and runs the command (a shell script) there,
    with its output in a directory this
    host shares with the machine (9p, read-write), then powers the machine off.

`run()` builds the initramfs, boots, waits and returns the script's exit code and output.
`missing()` names the Debian packages the machine needs that are not here.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("qemu-system-x86", "linux-image-amd64", "busybox-static", "cpio")
"""The Debian packages the machine needs (.ci/run installs them)."""
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
"""Kernel modules the initramfs loads (with what they depend on, from modules.dep)."""
SHARE_TAG, ROOT_TAG = "agentqshare", "hostroot"
SHARE_IN_VM = "/run/agentq-vm"
"""Where the shared directory is in the machine: the script, its output, its exit code."""
CONTROLLERS = "+memory +pids +cpu"
SERVICE_GROUP = "agentq.service"
"""The delegated group the command runs in (the root group hands it CONTROLLERS)."""

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "agentq-vm: $*" >&2; poweroff -f; }
mkdir -p /proc /sys /dev /lower /upper /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod "/modules/$m" || fail "insmod $m"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 @ROOT@ /lower \
  || fail "mount the host's root"
mount -t tmpfs -o mode=0755 tmpfs /upper
mkdir /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay \
  /newroot || fail "mount the overlay"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mkdir -p /newroot@SHARE@
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 @SHARE_TAG@ \
  /newroot@SHARE@ || fail "mount the shared directory"
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup || fail "mount cgroup2"
ip link set lo up
cd /newroot/sys/fs/cgroup
echo "@CONTROLLERS@" > cgroup.subtree_control || fail "enable @CONTROLLERS@"
mkdir @SERVICE@ && echo $$ > @SERVICE@/cgroup.procs || fail "make @SERVICE@"
cd /
# the new root becomes the root (switch_root), not a chroot: the kernel refuses a chrooted
# process a user namespace (bwrap's); busybox comes along to power off at the end
mkdir /newroot/run/agentq-vm-init
cp /bin/busybox /newroot/run/agentq-vm-init/busybox
cat > /newroot/run/agentq-vm-init/stage2 <<'STAGE2'
cd /
/bin/sh @SHARE@/job.sh > @SHARE@/output 2>&1 < /dev/null
echo $? > @SHARE@/exit_code
/run/agentq-vm-init/busybox sync
/run/agentq-vm-init/busybox poweroff -f
STAGE2
exec switch_root /newroot /run/agentq-vm-init/busybox sh /run/agentq-vm-init/stage2
"""


class VMUnavailable(RuntimeError):
    """The machine cannot be booted here; the message says why."""


@dataclass
class VMResult:
    exit_code: int
    output: str
    console: str
    share: Path
    """The shared directory (the script may leave files there); the caller removes it."""


def missing() -> list[str]:
    """The Debian packages the machine needs that are not installed here."""
    lacking = []
    for package in PACKAGES:
        try:
            status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                                    capture_output=True, text=True).stdout
        except OSError:
            status = ""
        if not status.endswith(" installed"):
            lacking.append(package)
    if "linux-image-amd64" not in lacking and kernel() is None:
        lacking.append("linux-image-amd64")
    return lacking


def accelerator() -> list[str]:
    """QEMU's accelerator: KVM where the CPU has hardware virtualization (vmx/svm) and
    /dev/kvm is ours; else QEMU's own emulator (TCG, one host thread a CPU). This host's
    /dev/kvm is PVM (`kvm_pvm`, pagetable-based KVM for machines without vmx/svm, like
    this virtual one): it boots only kernels built as PVM guests, and Debian's hangs
    right after its setup code there, so it is not used."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        flags = []
    if ({"vmx", "svm"} & set(flags) and os.access("/dev/kvm", os.R_OK | os.W_OK)
            and not os.path.exists("/sys/module/kvm_pvm")):
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def kernel() -> tuple[str, str] | None:
    """(vmlinuz, its modules' directory) of the newest Debian kernel installed, or None."""
    found = []
    for image in glob.glob("/boot/vmlinuz-*"):
        version = image.removeprefix("/boot/vmlinuz-")
        modules = f"/lib/modules/{version}"
        if os.path.exists(f"{modules}/modules.dep"):
            key = tuple(int(n) for n in re.findall(r"\d+", version))
            found.append((key, image, modules))
    if not found:
        return None
    _, image, modules = max(found)
    return image, modules


def _module_files(modules_dir: str) -> list[str]:
    """MODULES and what they depend on, as paths relative to `modules_dir`, each after
    what it needs (modules.dep lists a module's dependencies, nearest first)."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    with open(f"{modules_dir}/modules.dep") as f:
        for line in f:
            path, _, needs = line.partition(":")
            deps[path] = needs.split()
            name = os.path.basename(path).split(".ko")[0].replace("-", "_")
            by_name[name] = path
    order: list[str] = []

    def add(path: str) -> None:
        if path in order:
            return
        for need in deps[path]:
            add(need)
        order.append(path)
    for name in MODULES:
        if name not in by_name:
            raise VMUnavailable(f"the kernel in {modules_dir} has no {name} module")
        add(by_name[name])
    return order


def build_initramfs(dest: Path, modules_dir: str) -> Path:
    """The initramfs (a newc cpio archive, written by cpio) at `dest`."""
    tree = Path(tempfile.mkdtemp(prefix="agentq-vm-initramfs-"))
    try:
        (tree / "bin").mkdir()
        shutil.copy("/bin/busybox", tree / "bin" / "busybox")
        (tree / "modules").mkdir()
        names = []
        for path in _module_files(modules_dir):
            name = os.path.basename(path)
            shutil.copy(f"{modules_dir}/{path}", tree / "modules" / name)
            names.append(name)
        (tree / "modules.order").write_text("\n".join(names) + "\n")
        init = INIT
        for key, value in (("@ROOT@", ROOT_TAG), ("@SHARE_TAG@", SHARE_TAG),
                           ("@SHARE@", SHARE_IN_VM), ("@CONTROLLERS@", CONTROLLERS),
                           ("@SERVICE@", SERVICE_GROUP)):
            init = init.replace(key, value)
        (tree / "init").write_text(init)
        (tree / "init").chmod(0o755)
        files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        with open(dest, "wb") as out:
            subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=tree,
                           input="\n".join(files).encode(), stdout=out, check=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return dest


def run(script: str, *, timeout_s: float, memory_mib: int = 2048, cpus: int = 2) -> VMResult:
    """Boot the machine, run `script` (sh, as root, cwd /, in SERVICE_GROUP) and power off.
    VMUnavailable if it cannot boot here or did not finish within `timeout_s`."""
    lacking = missing()
    if lacking:
        raise VMUnavailable(f"the cgroup v2 machine needs the Debian packages "
                            f"{' '.join(lacking)}")
    image, modules_dir = kernel()  # type: ignore[misc]  # missing() checked it
    share = Path(tempfile.mkdtemp(prefix="agentq-vm-share-"))
    try:
        return _boot(script, image, modules_dir, share, timeout_s, memory_mib, cpus)
    except BaseException:
        shutil.rmtree(share, ignore_errors=True)
        raise


def _boot(script: str, image: str, modules_dir: str, share: Path, timeout_s: float,
          memory_mib: int, cpus: int) -> VMResult:
    (share / "job.sh").write_text(script)
    initramfs = build_initramfs(share / "initramfs.cpio", modules_dir)
    console = share / "console.log"
    command = [
        "qemu-system-x86_64", *accelerator(), "-m", str(memory_mib),
        "-smp", str(cpus), "-nodefaults", "-no-user-config", "-display", "none",
        "-no-reboot", "-serial", f"file:{console}", "-kernel", image, "-initrd",
        str(initramfs), "-append",
        "console=ttyS0 loglevel=4 panic=-1 cgroup_no_v1=all",
        "-virtfs", f"local,path=/,mount_tag={ROOT_TAG},security_model=none,readonly=on,"
                   f"multidevs=remap",
        "-virtfs", f"local,path={share},mount_tag={SHARE_TAG},security_model=none,"
                   f"multidevs=remap",
    ]
    from tests.support.stack import die_with_parent
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        qemu_output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise VMUnavailable(f"the machine did not finish within {timeout_s:.0f} s; its "
                            f"console: {_tail(console)}") from None
    finally:  # given up, or our caller interrupted (pytest-timeout): the machine goes too
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    exit_file = share / "exit_code"
    if not exit_file.exists():
        raise VMUnavailable(
            f"the machine stopped (qemu exit {proc.returncode}) before the script ended: "
            f"{qemu_output.decode(errors='replace')[-800:]} console: {_tail(console)}")
    output = share / "output"
    return VMResult(exit_code=int(exit_file.read_text()),
                    output=output.read_text(errors="replace") if output.exists() else "",
                    console=console.read_text(errors="replace"), share=share)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(none)"


def shell_env(env: dict[str, str]) -> str:
    """`export` lines for a script."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
