"""The proposal prompt the llm proposer sends: every metric of the parent with its interval, its whole
reflection, within a token budget; checked on the request a real local server receives."""

from __future__ import annotations

import json

import openai_server  # tests/openai_server.py
import pytest
from results_util import record

from engine.archive.store import Archive

SPLITS = ("easy", "medium", "hard")
KINDS = ("acc@1", "pass@1", "pass@8", "valid_rate", "mean_length")


def _results(level: float) -> dict:
    m, iv = {}, {}
    for i, s in enumerate(SPLITS):
        for j, k in enumerate(KINDS):
            v = round(level * (0.8 - 0.3 * i) + 0.01 * j, 4) if k != "mean_length" else 12.5 + i
            m[f"{s}/{k}"] = v
            iv[f"{s}/{k}"] = [round(v - 0.02, 4), round(v + 0.02, 4)]
    m.update(overall=round(level * 0.4, 4), valid_rate=0.95, mean_length=12.3)
    for k in ("overall", "valid_rate", "mean_length"):
        iv[k] = [round(m[k] - 0.01, 4), round(m[k] + 0.01, 4)]
    return {"metrics": m, "intervals": iv, "status": "evaluated"}


REFLECTION = (
    "# Reflection on p\n\n## Metrics vs parent grpo\n\n| metric | node | parent | delta | beyond interval |\n"
    "|---|---|---|---|---|\n"
    + "".join(f"| {s}/{k} | 0.5 | 0.4 | 0.1 | yes |\n" for s in SPLITS for k in KINDS)
    + "\n## Training trajectory vs parent grpo\n\n| series | node | parent | change |\n"
    "|---|---|---|---|\n| policy entropy | 0.3 | 0.2 | x1.50 |\n"
    + "\n## Diagnostics\n\n- hard/pass@8 0.21 -> 0.26 (+0.05), beyond its 95% interval\n"
    "- entropy collapse: policy entropy fell from 1.4 to 0.3 (21% of its start)\n"
    "- vs parent: kept more entropy (policy entropy x1.50 over the last third of training)\n\n"
    "## Mechanism-level analysis\n\nTHE-LAST-SENTENCE of a long diagnosis is kept.\n"
)


@pytest.fixture
def arch(tmp_path):
    a = Archive.init(tmp_path / "exp")
    record(a, "grpo", _results(1.0))
    a.spawn("grpo", "p", proposal="# p\n\n## Mechanism\nclip wider")
    record(a, "p", _results(1.1))
    a.record_reflection("p", REFLECTION)
    for i in range(6):
        a.spawn("grpo", f"other-{i}")
        record(a, f"other-{i}", _results(0.9 + i / 100))
        a.record_reflection(f"other-{i}", REFLECTION.replace("THE-LAST", f"OTHER-{i}"))
    return a


def _parent_section(prompt: str) -> str:
    return prompt.split("## Parent node", 1)[1].split("### Parent's proposal", 1)[0]


def test_parent_gets_every_metric_with_interval_and_whole_reflection(arch):
    from engine.operators import tokens
    from engine.operators.context import build_context
    from engine.operators.proposers.llm import proposal_messages

    cfg = arch.config()
    ctx = build_context(arch, "p", cfg, seed=0)
    user = proposal_messages(ctx, "p", 4, 0)[1]["content"]
    part = _parent_section(user)
    metrics = arch.node("p").metrics
    iv = arch.node("p").result.intervals
    assert len(metrics) == 18
    for k, v in metrics.items():
        assert f"{k}={v:.4g} [{iv[k][0]:.4g}, {iv[k][1]:.4g}]" in part, k
    assert "hard/pass@8=" in part
    assert REFLECTION.strip() in part  # whole, diagnostics and analysis included
    size = tokens.count_tokens(user)
    print(
        f"\nproposal prompt for 7 evaluated nodes: {len(user)} chars, {size} tokens ({tokens.method()})"
    )
    assert size <= cfg.propose.context_tokens and ctx.trimmed == []


def test_budget_trims_the_others_never_the_parent(arch):
    from engine.operators import tokens
    from engine.operators.context import build_context

    ctx = build_context(arch, "p", arch.config(), seed=0)
    full = ctx.render()
    assert "OTHER-0" in full or "OTHER-1" in full  # other nodes' analyses fit by default
    # the other nodes' reflections without their tables; their findings, whole
    others = full[full.index("### Parent's algorithm.py") :]
    others = others[others.index("\n## ") :]
    assert "kept more entropy" in others and "| policy entropy |" not in others
    ctx.budget_tokens = tokens.count_tokens(full) - 200
    small = ctx.render()
    assert tokens.count_tokens(small) <= ctx.budget_tokens
    assert ctx.trimmed and "(context trimmed to its" in small
    assert "OTHER-" not in small and REFLECTION.strip() in _parent_section(small)
    ctx.budget_tokens = 10  # impossible: everything optional goes, the parent stays whole
    tiny = ctx.render()
    assert REFLECTION.strip() in _parent_section(tiny) and "Exploratory nodes" not in tiny


def test_the_request_on_the_wire_carries_it(arch):
    from engine.config import LLMConfig
    from engine.operators.llm import LLMClient
    from engine.operators.proposers.llm import LLMProposer

    reply = openai_server.proposal_reply("x", "def helper():\n    return 1\n")
    with openai_server.ScriptedOpenAI([reply]) as srv:
        llm = LLMClient(LLMConfig(base_url=srv.base_url, api_key_env="POISE_NO_KEY"), arch)
        from engine.operators.context import build_context

        ctx = build_context(arch, "p", arch.config(), seed=0)
        out = LLMProposer(llm).propose(arch, "p", ctx, arch.config(), 1, 0)
    assert out[0].name == "x"
    sent = srv.requests[0]["messages"][1]["content"]
    assert "THE-LAST-SENTENCE" in sent and "hard/pass@8=" in _parent_section(sent)
    assert json.dumps(srv.requests[0]).count("[") > 18


def test_a_reply_of_many_more_proposals_than_asked_is_cut_to_a_bound(arch):
    """A reply may hold more proposals than the n asked for; only the first 4n are screened (each is
    built and fingerprinted), so a reply packed with thousands costs no more."""
    from engine.config import LLMConfig
    from engine.operators.context import build_context
    from engine.operators.llm import LLMClient
    from engine.operators.proposers.llm import MAX_PROPOSALS_PER_ASKED, LLMProposer

    one = json.loads(openai_server.proposal_reply("x", "def helper():\n    return 1\n"))
    item = one["proposals"][0]
    many = [dict(item, name=f"p{i}") for i in range(500)]
    with openai_server.ScriptedOpenAI([json.dumps({"proposals": many})]) as srv:
        llm = LLMClient(LLMConfig(base_url=srv.base_url, api_key_env="POISE_NO_KEY"), arch)
        ctx = build_context(arch, "p", arch.config(), seed=0)
        out = LLMProposer(llm).propose(arch, "p", ctx, arch.config(), 2, 0)
    assert [p.name for p in out] == [f"p{i}" for i in range(2 * MAX_PROPOSALS_PER_ASKED)]


def test_a_failed_parent_is_not_among_the_nodes_to_avoid(archive):
    """Proposing from a failed node (``poise-git propose NODE``) shows it as the parent, not also
    among the rejected or failed nodes to avoid, where it took the place of one of them."""
    from engine.operators.context import MAX_PER_TIER, build_context

    for i in range(MAX_PER_TIER + 1):
        archive.spawn("grpo", f"f{i}", proposal=f"# f{i}\n")
        record(archive, f"f{i}", {"status": "failed", "reason": f"diverged {i}", "metrics": {}})
    parent = f"f{MAX_PER_TIER}"  # the newest failure
    ctx = build_context(archive, parent, archive.config())
    assert ctx.parent.name == parent
    assert [s.name for s in ctx.rejected] == [f"f{i}" for i in range(MAX_PER_TIER - 1, -1, -1)]
    avoid = ctx.render().split("## Rejected or failed nodes")[1].split("## ")[0]
    assert f"- {parent} [failed]" not in avoid and "- f0 [failed]" in avoid
