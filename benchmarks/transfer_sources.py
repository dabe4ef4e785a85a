"""Each finished discovery search's best node as a protocol-sweep source, to re-measure what the searches
found under another protocol (the transfer check in docs/calibration.md).

    .venv/bin/python benchmarks/transfer_sources.py --workdir .cache/discovery-explore --label v3 \\
        --out benchmarks/results/transfer-sources
    python benchmarks/bench_protocol_sweep.py --preset large --variant large-gpu: \\
        --mechanisms grpo,v3_s0,v3_s1,v3_s2 --sources benchmarks/results/transfer-sources --seeds 24

For every finished search in ``--workdir`` (``METHOD-sSEED.json`` beside its archive
``METHOD-sSEED``, as ``bench_discovery.py`` leaves them), the best node's ``algorithm.py`` is read
from its archive and written byte for byte to ``OUT/LABEL_sSEED.py`` (``LABEL_METHOD_sSEED.py`` for
a method other than ``loop``), and the root's to ``OUT/grpo.py``. Every search must share one root,
and a file already in OUT must hold the same code: a different root or a changed file is refused,
not overwritten. Each source's provenance (archive, node, commit, search seed, what the search
measured) is one line of ``OUT/provenance.jsonl``, replaced when written again. Trains nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_discovery import finished_searches
from proxy_runs import fmt_iv

from engine.archive.store import ROOT_NAME, Archive


def write_source(out: Path, name: str, source: str) -> bool:
    """Write ``OUT/NAME.py``; False when it already holds this code. A different code is refused:
    the rows measured under NAME would no longer say what ran."""
    path = out / f"{name}.py"
    if path.is_file():
        if path.read_text(encoding="utf-8") == source:
            return False
        raise SystemExit(
            f"transfer_sources: {path} already holds other code; choose another --label or --out"
        )
    path.write_text(source, encoding="utf-8")
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workdir", required=True, help="a bench_discovery.py --workdir")
    ap.add_argument("--label", required=True, help="the sources' name prefix, e.g. v3")
    ap.add_argument("--out", required=True, help="the --sources directory to write")
    ap.add_argument("--methods", default="loop", help="comma-separated (loop, random)")
    args = ap.parse_args()
    if not args.label.isidentifier():
        raise SystemExit(f"transfer_sources: --label {args.label!r} must be a Python identifier")
    work, out = Path(args.workdir), Path(args.out)
    searches = finished_searches(work, args.methods.split(","))
    if not searches:
        raise SystemExit(f"transfer_sources: no finished search of {args.methods} in {work}")
    out.mkdir(parents=True, exist_ok=True)
    prov_path = out / "provenance.jsonl"
    provenance = {}
    if prov_path.is_file():
        for line in prov_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                provenance[rec["file"]] = rec
    print("| file | node | archive | best Overall | paired diff on the search's seeds | written |")
    print("|---|---|---|---|---|---|")
    for method, seed, path, res in searches:
        best = res.get("best")
        if not best:
            print(f"({path.name}: no best node, skipped)")
            continue
        if not (path / ".git").exists():
            print(f"({path.name}: no archive at {path}, skipped)")
            continue
        archive = Archive(path)
        nodes = archive.nodes()
        root_written = write_source(out, "grpo", archive.algorithm(ROOT_NAME))
        if root_written or "grpo.py" not in provenance:
            provenance["grpo.py"] = {"file": "grpo.py", "node": ROOT_NAME, "archive": str(path)}
        name = f"{args.label}_s{seed}" if method == "loop" else f"{args.label}_{method}_s{seed}"
        written = write_source(out, name, archive.algorithm(best))
        provenance[f"{name}.py"] = {
            "file": f"{name}.py",
            "node": best,
            "commit": nodes[best].commit,
            "archive": str(path),
            "method": method,
            "search_seed": seed,
            "best_overall": res.get("best_overall"),
            "best_diff": res.get("best_diff"),
            "best_diff_interval": res.get("best_diff_interval"),
        }
        ivs = fmt_iv(res.get("best_diff_interval"), signed=True)
        print(
            f"| {name}.py | {best} | {path.name} | {res.get('best_overall', float('nan')):.3f} | "
            f"{res.get('best_diff', float('nan')):+.3f} {ivs} | {'yes' if written else 'same code'} |"
        )
    prov_path.write_text(
        "".join(json.dumps(provenance[k]) + "\n" for k in sorted(provenance)), encoding="utf-8"
    )
    print(f"sources in {out}; provenance in {prov_path}")


if __name__ == "__main__":
    main()
