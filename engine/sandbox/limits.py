"""Resource limits of one sandboxed child. The kernel enforces them (rlimits set by the launcher before
any candidate code runs; tmpfs sizes); the wall clock and the per-call deadlines are enforced by the
parent, which SIGKILLs the whole sandbox (its own pid namespace) when one passes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    wall_s: float = 600.0
    """wall-clock limit of the whole child (parent-enforced SIGKILL)"""
    cpu_s: float | None = None
    """CPU-time limit (RLIMIT_CPU; SIGXCPU, then SIGKILL 5 s later); None: the wall-clock limit"""
    memory_mb: int = 4096
    """memory limit: the address space (RLIMIT_AS), or the data segment (RLIMIT_DATA) with ``gpu``"""
    file_mb: int = 64
    """largest file the child may write (RLIMIT_FSIZE)"""
    processes: int = 64
    """processes and threads of the child's user (RLIMIT_NPROC)"""
    open_files: int = 256
    """open file descriptors (RLIMIT_NOFILE)"""
    scratch_mb: int = 256
    """size of the writable scratch (a tmpfs under the OS boundary) and of /tmp"""
    output_kb: int = 64
    """the tail of stdout + stderr the parent keeps (the rest is read and dropped)"""
    channel_mb: int = 256
    """bytes the child may send over its channel in all"""
    gpu: bool = False
    """the child may use the host's NVIDIA GPUs: its /dev gets their device nodes
    (``boundary.gpu_device_nodes``) and ``memory_mb`` bounds RLIMIT_DATA instead of RLIMIT_AS"""

    def with_(self, **kw) -> Limits:
        return replace(self, **kw)

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """``{RLIMIT name: (soft, hard)}`` for the launcher (``engine.sandbox.launch``).

        With ``gpu`` the memory limit is RLIMIT_DATA, not RLIMIT_AS: CUDA's initialisation reserves
        far more virtual address space than any real limit (its unified address space), so under
        RLIMIT_AS it fails and torch sees no GPU. Those reservations are PROT_NONE mappings, which do
        not count toward RLIMIT_DATA; the child's heap and private writable mappings still do."""
        cpu = int(self.cpu_s if self.cpu_s is not None else self.wall_s) + 1
        memory = "RLIMIT_DATA" if self.gpu else "RLIMIT_AS"
        return {
            "RLIMIT_CPU": (cpu, cpu + 5),
            memory: (self.memory_mb * MB, self.memory_mb * MB),
            "RLIMIT_FSIZE": (self.file_mb * MB, self.file_mb * MB),
            "RLIMIT_NPROC": (self.processes, self.processes),
            "RLIMIT_NOFILE": (self.open_files, self.open_files),
            "RLIMIT_CORE": (0, 0),
        }

    def to_dict(self) -> dict:
        return asdict(self)
