"""A tiny causal GPT (pre-LN, learned positions) with KV-cache sampling; ~106k parameters at d=64."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor, cache: dict | None = None) -> Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = (
            self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        )  # [b, h, t, dh] each
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        causal = t > 1  # with a cache, decoding one token attends to everything before it
        if causal and k.shape[2] != t:
            raise ValueError("multi-token decoding with a non-empty cache is not supported")
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 64, heads: int = 4, layers: int = 2, max_len: int = 64):
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: Tensor, caches: list[dict] | None = None, offset: int = 0) -> Tensor:
        """Logits [B, T, V] for tokens idx [B, T] at positions offset..offset+T-1."""
        t = idx.shape[1]
        pos = torch.arange(offset, offset + t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if caches is None else caches[i])
        return self.head(self.ln(x))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


@torch.no_grad()
def generate(
    model: TinyGPT,
    prompts: Tensor,
    max_new: int,
    eos: int,
    pad: int,
    *,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    return_logprobs: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Sample responses [N, max_new] for equal-length prompts [N, P] with a KV cache; PAD after EOS.

    With ``return_logprobs`` also the sampled tokens' log-probabilities and the entropies [N, max_new]
    of the (temperature-scaled) sampling distribution (0 after EOS): the rollout's old log-probs."""
    n = prompts.shape[0]
    caches: list[dict] = [{} for _ in model.blocks]
    logits = model(prompts, caches, 0)[:, -1]
    out = torch.full((n, max_new), pad, dtype=torch.long, device=prompts.device)
    logp_out = torch.zeros(n, max_new, device=prompts.device) if return_logprobs else None
    ent_out = torch.zeros(n, max_new, device=prompts.device) if return_logprobs else None
    done = torch.zeros(n, dtype=torch.bool, device=prompts.device)
    pos = prompts.shape[1]
    for t in range(max_new):
        logp_all = None
        if greedy:
            nxt = logits.argmax(-1)
        else:
            logp_all = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
            nxt = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        out[:, t] = nxt
        if return_logprobs:
            if logp_all is None:
                logp_all = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
            live = ~done
            logp_out[:, t] = torch.where(live, logp_all.gather(-1, nxt[:, None]).squeeze(1), 0.0)
            ent_out[:, t] = torch.where(live, -(logp_all.exp() * logp_all).sum(-1), 0.0)
        done |= nxt == eos
        if bool(done.all()) or t == max_new - 1:
            break
        logits = model(nxt[:, None], caches, pos)[:, -1]
        pos += 1
    if return_logprobs:
        return out, logp_out, ent_out
    return out


def response_logprobs(
    model: TinyGPT, prompts: Tensor, responses: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Per-token log-probabilities and entropies [N, T] of ``responses`` given ``prompts``."""
    seq = torch.cat([prompts, responses], dim=1)
    p = prompts.shape[1]
    logits = model(seq[:, :-1])[:, p - 1 :] / temperature
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, responses[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
