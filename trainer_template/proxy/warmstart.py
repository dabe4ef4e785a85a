"""The supervised warm start: trained once per settings hash, cached on disk, shared by every candidate.

Two supervised phases (``WarmStart`` in protocol.py): *skill* teaches the arithmetic (mostly written
chains, some direct answers, over every chain length), then *habits* fine-tunes the response-style mix
the RL start has: P(direct, chain, ramble, give-up) set per difficulty split. The result can write
correct long chains but rarely chooses to on hard prompts, rambles past the response cap now and
then, and sometimes gives up.

The build is deterministic: one torch thread, deterministic kernels, every random draw from generators
seeded by the settings. :func:`content_hash` identifies the weights themselves; the protocol records it.

Lookup: the checkpoints shipped with the package (``trainer_template/proxy/checkpoints/``, built by
``python -m trainer_template.proxy.worker warmstart``), then the cache ``$POISE_CACHE_DIR`` or
``~/.cache/poise-git/proxy``; file ``warmstart-<settings hash>.pt``. Concurrent builders serialize on a
lock file; the checkpoint appears atomically (write, then rename).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer_template.proxy import task
from trainer_template.proxy.model import TinyGPT
from trainer_template.proxy.protocol import ProxyProtocol, WarmStart

SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"


class WarmStartMismatch(RuntimeError):
    """A checkpoint's weights are not the ones the protocol pins."""


def cache_dir(explicit: str | Path | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("POISE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "poise-git" / "proxy"


def build_model(ws: WarmStart) -> TinyGPT:
    return TinyGPT(
        task.VOCAB_SIZE,
        ws.d_model,
        ws.heads,
        ws.layers,
        max_len=task.PROMPT_LEN + task.MAX_RESPONSE,
    )


def style_weights(ws: WarmStart, k: int) -> list[float]:
    """P(direct, chain, ramble, give-up) of the habits phase at chain length k (by its split)."""
    return list(
        {"easy": ws.habit_easy, "medium": ws.habit_medium, "hard": ws.habit_hard}[task.split_of(k)]
    )


def _decompose(gen: torch.Generator, p: task.Problem, rate: float) -> list[bool]:
    """Which multiplication steps a written chain decomposes; draws nothing at rate 0, so a warm start
    that never decomposes draws exactly what it drew before decomposition existed."""
    if rate <= 0:
        return []
    return [
        s == task.MUL and float(torch.rand((), generator=gen, dtype=torch.float64)) < rate
        for s, _ in p.ops
    ]


def _response(
    gen: torch.Generator, p: task.Problem, weights, ws: WarmStart, decompose: float = 0.0
) -> list[int]:
    w = torch.tensor(weights, dtype=torch.float64)
    style = task.STYLES[int(torch.multinomial(w, 1, generator=gen))]
    if style == "ramble":
        n = int(torch.randint(1, ws.filler_max + 1, (1,), generator=gen))
        dec = _decompose(gen, p, decompose)
        return task.encode_response(p, "ramble", filler=[0] * (p.k - 1) + [n], decompose=dec)
    if style == "giveup":
        stop = int(torch.randint(0, p.k, (1,), generator=gen))
        return task.encode_response(p, "giveup", stop=stop, decompose=_decompose(gen, p, decompose))
    if style == "chain":
        return task.encode_response(p, "chain", decompose=_decompose(gen, p, decompose))
    return task.encode_response(p, style)


def sft_batch(gen: torch.Generator, ws: WarmStart, phase: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences [B, L] and a loss mask [B, L-1] over response targets (cut at the cap)."""
    power = ws.skill_k_power if phase == "skill" else 0.0
    ks = task.sample_ks(gen, ws.batch, task.k_weights(power))
    length = task.PROMPT_LEN + task.MAX_RESPONSE
    seqs = torch.full((ws.batch, length), task.PAD, dtype=torch.long)
    mask = torch.zeros(ws.batch, length - 1, dtype=torch.bool)
    for i, k in enumerate(ks):
        p = task.sample_problem(gen, k, ws.skill_mul_rate if phase == "skill" else None)
        weights = style_weights(ws, k) if phase == "habits" else ws.skill_styles
        rate = ws.habit_decompose if phase == "habits" else ws.skill_decompose
        resp = _response(gen, p, weights, ws, rate)[: task.MAX_RESPONSE]
        toks = task.encode_prompt(p) + resp
        seqs[i, : len(toks)] = torch.tensor(toks)
        mask[i, task.PROMPT_LEN - 1 : task.PROMPT_LEN - 1 + len(resp)] = True
    return seqs, mask


@contextlib.contextmanager
def deterministic(threads: int = 1) -> Iterator[None]:
    """One torch thread and deterministic kernels for the duration (restored afterwards)."""
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det)
        torch.set_num_threads(prev_threads)


def _phase(model, gen, ws: WarmStart, phase: str, steps: int, lr: float, log) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1 - s / steps)
    )
    for step in range(steps):
        seqs, mask = sft_batch(gen, ws, phase)
        logits = model(seqs[:, :-1])
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), seqs[:, 1:].reshape(-1), reduction="none"
        )
        loss = (loss * mask.reshape(-1)).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log and (step % 200 == 0 or step == steps - 1):
            log(f"warm start {phase} step {step}/{steps} loss {loss.item():.4f}")


def train_warmstart(ws: WarmStart, log=None, phases=("skill", "habits"), model=None) -> TinyGPT:
    """The two supervised phases, deterministic given ``ws`` (one thread, deterministic kernels).
    Each phase draws from its own generator, so the habits phase can be re-run on a skill model."""
    with deterministic(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(ws.seed)
        model = model if model is not None else build_model(ws)
        for i, phase in enumerate(("skill", "habits")):
            if phase in phases:
                gen = torch.Generator().manual_seed(ws.seed * 1000 + i)
                steps = ws.skill_steps if phase == "skill" else ws.habit_steps
                lr = ws.lr if phase == "skill" else ws.habit_lr
                _phase(model, gen, ws, phase, steps, lr, log)
    return model


def content_hash(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over the weights (names, dtypes, shapes, bytes in name order): the checkpoint's identity,
    independent of how the file was serialized."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


def checkpoint_hash(path: str | Path) -> str:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    return content_hash(ckpt["state_dict"])


def checkpoint_name(protocol: ProxyProtocol) -> str:
    """The file name of ``protocol``'s warm start, shipped or cached: one per settings hash."""
    return f"warmstart-{protocol.warmstart_hash()}.pt"


def ensure_warmstart(
    protocol: ProxyProtocol, directory: str | Path | None = None, log=None
) -> Path:
    """The cached checkpoint for ``protocol.warmstart``, trained now if absent. Returns its path.

    When the protocol pins the weights (``warmstart_sha256``), a checkpoint with other weights raises
    :class:`WarmStartMismatch` instead of being used."""
    fname = checkpoint_name(protocol)
    if (SHIPPED_DIR / fname).is_file() and directory is None:
        path = SHIPPED_DIR / fname
    else:
        path = _cached(protocol, fname, directory, log)
    verify_warmstart(protocol, path)
    return path


def verify_warmstart(protocol: ProxyProtocol, path: str | Path) -> str:
    """The content hash of ``path``; raises WarmStartMismatch when the protocol pins another one."""
    got = checkpoint_hash(path)
    want = protocol.warmstart_sha256
    if want and got != want:
        raise WarmStartMismatch(
            f"the warm start {path} has weights {got[:19]}..., the protocol pins {want[:19]}...; "
            "it was built differently (another torch version or platform?): remove it to rebuild, or "
            "use the checkpoint shipped with the package"
        )
    return got


def _cached(protocol: ProxyProtocol, fname: str, directory, log) -> Path:
    d = cache_dir(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / fname
    if path.is_file():
        return path
    with open(d / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():  # another process built it while we waited
            return path
        t0 = time.monotonic()
        model = train_warmstart(protocol.warmstart, log)
        save_warmstart(model, protocol, path, train_s=time.monotonic() - t0)
    return path


def save_warmstart(
    model: TinyGPT, protocol: ProxyProtocol, path: Path, train_s: float = 0.0
) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    sd = model.state_dict()
    torch.save(
        {
            "settings": protocol.to_dict()["warmstart"],
            "state_dict": sd,
            "content_sha256": content_hash(sd),
            "torch": str(torch.__version__),
            "train_s": round(train_s, 1),
        },
        tmp,
    )
    os.replace(tmp, path)


def load_warmstart(path: str | Path, ws: WarmStart, device: str | torch.device = "cpu") -> TinyGPT:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(ws)
    model.load_state_dict(ckpt["state_dict"])
    return model.to(device)
