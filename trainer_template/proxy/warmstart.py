"""The supervised warm start: trained once per settings hash, cached on disk, shared by every candidate.

Lookup: the checkpoints shipped with the package (``trainer_template/proxy/checkpoints/``, built by
``python -m trainer_template.proxy.worker warmstart``), then the cache ``$POISE_CACHE_DIR`` or
``~/.cache/poise-git/proxy``; file ``warmstart-<hash>.pt``. Concurrent builders serialize on a lock file;
the checkpoint appears atomically (write, then rename).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer_template.proxy import task
from trainer_template.proxy.model import TinyGPT
from trainer_template.proxy.protocol import ProxyProtocol, WarmStart

SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"


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


def sft_batch(gen: torch.Generator, ws: WarmStart) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences [B, L] and a loss mask [B, L-1] over response targets."""
    ks = task.sample_ks(gen, ws.batch, task.k_weights(ws.k_power))
    broken = (torch.rand(ws.batch, generator=gen) < ws.broken_rate).tolist()
    kinds = torch.randint(1, 4, (ws.batch,), generator=gen).tolist()
    length = task.PROMPT_LEN + task.MAX_RESPONSE
    seqs = torch.full((ws.batch, length), task.PAD, dtype=torch.long)
    mask = torch.zeros(ws.batch, length - 1, dtype=torch.bool)
    for i, k in enumerate(ks):
        p = task.sample_problem(gen, k)
        resp = task.encode_response(p, kinds[i] if broken[i] else 0)
        toks = task.encode_prompt(p) + resp
        seqs[i, : len(toks)] = torch.tensor(toks)
        mask[i, task.PROMPT_LEN - 1 : task.PROMPT_LEN - 1 + len(resp)] = True
    return seqs, mask


def train_warmstart(ws: WarmStart, log=None) -> TinyGPT:
    torch.manual_seed(ws.seed)
    gen = torch.Generator().manual_seed(ws.seed)
    model = build_model(ws)
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.01)
    warm = max(1, ws.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1 - s / ws.steps)
    )
    for step in range(ws.steps):
        seqs, mask = sft_batch(gen, ws)
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
        if log and (step % 100 == 0 or step == ws.steps - 1):
            log(f"warm start step {step}/{ws.steps} loss {loss.item():.4f}")
    return model


def ensure_warmstart(
    protocol: ProxyProtocol, directory: str | Path | None = None, log=None
) -> Path:
    """The cached checkpoint for ``protocol.warmstart``, trained now if absent. Returns its path."""
    fname = f"warmstart-{protocol.warmstart_hash()}.pt"
    if (SHIPPED_DIR / fname).is_file() and directory is None:
        return SHIPPED_DIR / fname
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
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(
            {
                "settings": protocol.to_dict()["warmstart"],
                "state_dict": model.state_dict(),
                "train_s": time.monotonic() - t0,
            },
            tmp,
        )
        os.replace(tmp, path)
    return path


def load_warmstart(path: str | Path, ws: WarmStart) -> TinyGPT:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(ws)
    model.load_state_dict(ckpt["state_dict"])
    return model
