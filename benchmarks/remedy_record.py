"""Where did a search's diagnosis send its candidates, and what did the remedies do? For each
finished search of the discovery benchmark: the candidates that applied each remedy of an entropy
collapse, however they were drawn (their motivation names it), each remedy's trials judged on the
policy's entropy against the parent's, seed by seed (:func:`engine.operators.proposers.remedies.remedy_trials`),
the candidate from which each remedy was spent (by the results recorded before that candidate was
created, :func:`~engine.operators.proposers.remedies.spent_remedies`), and the candidates that carry
a strong KL anchor.

    .venv/bin/python benchmarks/remedy_record.py --workdir .cache/discovery-spent \
        [--json benchmarks/results/remedy-record.json]

Run on searches made before remedies were spent (``--remedy-trials 0``, or before 2026-11-28), the
"spent from" column says when the rule would have spent each remedy. Results recorded before the
per-seed tails are read from each seed's MLflow history, as ``training_vs_parent.py`` does. Nothing
is trained: it reads finished searches.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from bench_discovery import searched_archives
from proxy_runs import ROOT, write_results
from training_vs_parent import with_tails

ANCHOR = 0.01
"""a KL weight at least this strong counts as an anchor (10x GRPO's 0.001)"""
APPLIED = re.compile(r"\(against its [a-z ]+: ([a-z_, ]+)\)")


def read_search(path: Path, preset: str, needed: int) -> dict:
    """The search's remedy record (see the module's docstring)."""
    from engine.archive.store import Archive
    from engine.config import REMEDY_MOVES
    from engine.operators.proposers.offline import archive_evidence, archive_remedy_trials
    from engine.operators.proposers.remedies import spent_remedies

    archive = Archive(path)
    nodes = {n: with_tails(archive, x) for n, x in archive.nodes(f"proxy/{preset}").items()}
    evidence = archive_evidence(archive, archive.config(), nodes, read_code=True)
    specs = {n: ev.spec() for n, ev in evidence.items()}
    candidates = sorted((n for n, x in nodes.items() if x.parent), key=lambda n: nodes[n].created)
    blobs = archive.git.cat_blobs([f"{nodes[n].commit}:records/proposal.json" for n in candidates])
    applied: Counter = Counter()
    for blob in blobs:
        found = APPLIED.search((json.loads(blob) or {}).get("motivation", "")) if blob else None
        if found:
            applied.update(m.strip() for m in found.group(1).split(","))
    trials = archive_remedy_trials(archive, nodes, evidence)
    verdicts = {m: Counter(t.verdict for t in trials if m in t.moves) for m in REMEDY_MOVES}
    spent_from: dict[str, int | None] = dict.fromkeys(REMEDY_MOVES)
    for i, name in enumerate(candidates, 1):
        before = {
            n: x
            for n, x in nodes.items()
            if x.result is None or x.result.recorded_at < nodes[name].created
        }
        known = [t for t in trials if t.node in before]
        for move in spent_remedies(known, ("entropy collapse",), needed):
            spent_from[move] = spent_from[move] or i
    anchored = sum(
        1 for n in candidates if specs.get(n) and specs[n]["hp"].get("kl_coef", 0.0) >= ANCHOR
    )
    return {
        "archive": path.name,
        "candidates": len(candidates),
        "applied": {m: applied.get(m, 0) for m in REMEDY_MOVES},
        "verdicts": {m: dict(sorted(v.items())) for m, v in verdicts.items()},
        "spent_from": spent_from,
        "anchored": anchored,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "discovery"))
    ap.add_argument("--methods", default="loop")
    ap.add_argument("--preset", default="default", help="the searches' proxy preset")
    ap.add_argument(
        "--needed",
        type=int,
        default=2,
        help="the trials after which a remedy none raised the entropy is spent "
        "([propose].remedy_trials' default)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for _method, seed, path in searched_archives(Path(args.workdir), args.methods):
        rows.append({**read_search(path, args.preset, args.needed), "search_seed": seed})
    print(
        "| search seed | remedy | candidates applying it | trials: up / alike / down / unclear |"
        " spent from candidate |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        for m, n in r["applied"].items():
            v = r["verdicts"][m]
            tally = " / ".join(str(v.get(k, 0)) for k in ("up", "alike", "down", "unclear"))
            spent = r["spent_from"][m]
            print(
                f"| {r['search_seed']} | {m} | {n} | {tally} | {'—' if spent is None else spent} |"
            )
    for r in rows:
        print(
            f"search seed {r['search_seed']}: {r['anchored']} of {r['candidates']} candidates "
            f"carry a KL anchor >= {ANCHOR}"
        )
    if args.json:
        out = write_results(
            args.json,
            args,
            "candidates (counts); trials judged on the policy's entropy against the parent's, "
            "paired over the search's seeds",
            searches=rows,
        )
        print(f"written {out}")


if __name__ == "__main__":
    main()
