"""The OS boundary around candidate code: bubblewrap (Linux namespaces), or rlimits alone.

Under ``bwrap`` the child gets its own pid, network (no interfaces up), IPC, UTS and mount namespaces
and sees only: the Python installation and its site-packages, the project's own packages, a few files
of ``/etc`` (the dynamic loader's cache, passwd, group), a fresh ``/proc`` and ``/dev``, its inputs
read-only under ``/input`` and size-limited tmpfs at ``/scratch`` (its working and home directory) and
``/tmp``. ``$HOME``, the archive, the user's working directory and every other process are not there.
When the engine runs as root the sandbox is entered without a user namespace and the launcher drops
to a fresh unprivileged uid (so RLIMIT_NPROC applies and no file of root's is readable); otherwise
bubblewrap creates a user namespace and the child has no capabilities.

``POISE_SANDBOX``: ``auto`` (default) or ``bwrap`` (bubblewrap; where it cannot run, candidate code is
refused with one line saying how to install it or how to opt in to the weak mode) or ``none`` (the
weak mode, chosen explicitly: rlimits, an allowlisted environment and a session of its own, but the
user's filesystem, network and processes). ``docs/security.md`` has the threat model.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import PoiseError

log = logging.getLogger(__name__)

ENV_MODE = "POISE_SANDBOX"
MODES = ("auto", "bwrap", "none")
INPUT = "/input"
SCRATCH = "/scratch"
PROJECT = Path(__file__).resolve().parents[2]
MOUNTED_PACKAGES = ("engine", "trainer_template", "evaluators")
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; ci/setup.sh does it as root)"
)


class SandboxUnavailable(PoiseError):
    """POISE_SANDBOX=bwrap, and bubblewrap cannot run here."""


@dataclass(frozen=True)
class Boundary:
    kind: str
    """bwrap | rlimits"""
    note: str = ""
    """why the weak mode is in use (empty under bwrap)"""
    bwrap: str = ""
    """the bwrap executable"""

    @property
    def isolated(self) -> bool:
        return self.kind == "bwrap"

    def describe(self) -> str:
        if self.isolated:
            return "bwrap (namespaces: mount, pid, net, ipc, uts; rlimits)"
        return f"rlimits only (weak mode: {self.note})"


def mode() -> str:
    value = os.environ.get(ENV_MODE, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise PoiseError(f"{ENV_MODE} must be one of {', '.join(MODES)}, got {value!r}")
    return value


def resolve(requested: str | None = None) -> Boundary:
    """The boundary to use now (probed once per process and mode)."""
    return _resolve(requested or mode())


def _resolve(requested: str) -> Boundary:
    if requested == "none":
        return Boundary("rlimits", f"{ENV_MODE}=none")
    exe, problem = _bwrap()
    if not problem:
        return Boundary("bwrap", bwrap=exe)
    # never a silent fallback: the weak mode lets candidate code read what the user can (the
    # engine's environment in /proc, $HOME), so only an explicit POISE_SANDBOX=none chooses it
    raise SandboxUnavailable(
        f"candidate code needs the OS boundary, but {problem}: {INSTALL_HINT}; "
        f"or run it without the boundary (the weak mode, docs/security.md) with {ENV_MODE}=none"
    )


@functools.lru_cache(maxsize=1)
def _bwrap() -> tuple[str, str]:
    """The bwrap executable and why it cannot run here ('' when it can); probed once."""
    exe = shutil.which("bwrap") or ""
    return exe, "bubblewrap (bwrap) is not installed" if not exe else _probe(exe)


def _probe(exe: str) -> str:
    """'' when bwrap can start the Python interpreter with the real mounts, else the reason."""
    cmd = bwrap_command(Boundary("bwrap", bwrap=exe), None, 16) + [
        sys.executable,
        "-S",
        "-c",
        "import os; os.listdir('/scratch')",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start ({exc})"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return f"bwrap does not work here ({tail[:200]})"
    return ""


def readonly_paths() -> list[str]:
    """What the child may read: the interpreter, its site-packages, every other directory on the
    engine's import path (a ``.pth`` file's, PYTHONPATH's, a ``--system-site-packages`` venv's
    base site-packages; the child imports what the engine imports) and the project's packages."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(p for p in site.getsitepackages() if p)
    paths.update(import_path())
    user_site = site.getusersitepackages()
    if user_site and any(p.startswith(user_site) for p in sys.path):
        paths.add(user_site)
    exe = Path(sys.executable)
    paths.add(str(exe.parent))
    try:
        paths.add(str(exe.resolve().parent.parent))
    except OSError:
        pass
    paths.update(str(PROJECT / p) for p in MOUNTED_PACKAGES if (PROJECT / p).is_dir())
    out = sorted({str(Path(p)) for p in paths if p and Path(p).exists() and p != "/"})
    # a path under another one is covered by the outer bind; "/usr" is bound separately
    kept: list[str] = []
    for p in out:
        if p == "/usr" or p.startswith("/usr/"):
            continue
        if not any(p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


def import_path() -> list[str]:
    """The directories of ``sys.path`` the child may read. Left out: what would show more than an
    import path — the working directory (``python -m`` run in an archive or in ``$HOME``), the
    project's root (only its packages are bound), and any directory holding ``$HOME``, the working
    directory or the project (``/``, ``/home``)."""
    guarded = [PROJECT, Path.home().resolve()]
    try:
        guarded.append(Path.cwd().resolve())
    except OSError:  # the working directory was removed
        pass
    out = []
    for entry in sys.path:
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue
        p = Path(os.path.realpath(entry))
        if p == PROJECT or PROJECT in p.parents:
            continue
        if any(p == g or p in g.parents for g in guarded):
            continue
        out.append(entry)
    return out


def child_pythonpath() -> str:
    """A sandboxed child's PYTHONPATH: the project, then the engine's own PYTHONPATH entries that
    :func:`import_path` lets the child read (packages installed there, torch included)."""
    readable = {os.path.realpath(p) for p in import_path()}
    out = [str(PROJECT)]
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.realpath(entry) in readable and entry not in out:
            out.append(entry)
    return os.pathsep.join(out)


@functools.lru_cache(maxsize=4)
def _options(exe: str) -> frozenset[str]:
    """The options this bwrap knows (``--size`` and ``--disable-userns`` are recent)."""
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(w for w in (out.stdout + out.stderr).split() if w.startswith("--"))


def gpu_device_nodes(dev_root: str = "/dev") -> list[str]:
    """The host's NVIDIA device nodes under ``dev_root`` (``nvidiactl``, ``nvidia-uvm``,
    ``nvidia-uvm-tools``, ``nvidia0``.., ``nvidia-modeset``, and ``nvidia-caps`` when it is a
    directory): what a CUDA process opens."""
    root = Path(dev_root)
    nodes = []
    for path in sorted(root.glob("nvidia*")):
        if path.is_dir() == (path.name == "nvidia-caps"):  # the nodes, and that one directory
            nodes.append(str(path))
    return nodes


def bwrap_command(
    boundary: Boundary,
    input_dir: str | None,
    scratch_mb: int,
    gpu: bool = False,
    dev_root: str = "/dev",
) -> list[str]:
    """The bwrap prefix of a sandboxed command (the command itself follows).

    ``gpu``: the host's NVIDIA device nodes (:func:`gpu_device_nodes` of ``dev_root``) are bound
    into the child's fresh ``/dev`` at the same paths (the mount is read-only, but a character
    device opens for writing on a read-only mount)."""
    known = _options(boundary.bwrap)
    args = [boundary.bwrap, "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:  # the launcher drops to a fresh uid; it needs these two until then
        args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-all", "--unshare-user"]
        args += ["--disable-userns"] if "--disable-userns" in known else []
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/sbin", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]

    def tmpfs(path: str, size_bytes: int) -> list[str]:
        sized = ["--size", str(size_bytes)] if "--size" in known else []  # bwrap >= 0.8
        return ["--perms", "01777", *sized, "--tmpfs", path]

    # the writable tmpfs first: a project or venv under /tmp (a clone in /tmp) is bound on top of it
    args += ["--dev", "/dev", "--proc", "/proc"]
    for path in (SCRATCH, "/tmp"):
        args += tmpfs(path, int(scratch_mb) * 1024 * 1024)
    ro = readonly_paths()
    made: set[str] = {"/", "/usr", "/etc", "/tmp", SCRATCH, "/dev", "/proc"}
    for path in ro:  # bwrap would create the ancestors 0700: unreadable after the uid drop
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", path, path]
    args += tmpfs("/dev/shm", 1024 * 1024)
    for node in gpu_device_nodes(dev_root) if gpu else ():
        args += ["--dev-bind-try", node, "/dev/" + Path(node).relative_to(dev_root).as_posix()]
    args += ["--remount-ro", "/dev"]
    if input_dir:
        args += ["--ro-bind", input_dir, INPUT]
    args += ["--chdir", SCRATCH]
    return args
