"""The training data of the verl protocol: a seeded 5,000-problem subset of MATH levels 3-5 as parquet.

Reads the shipped ``data/math_train_l3to5.jsonl`` (see ``data/PROVENANCE.md``); the gold answer is the
last ``\\boxed{}`` of each solution. Rows follow verl's RL dataset format: ``data_source``, ``prompt``
(chat messages with the Qwen2.5-Math CoT system prompt), ``ability``, ``reward_model.ground_truth``,
``extra_info``. The problems not drawn form the validation file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from evaluators.generation import SYSTEM_PROMPT  # the evaluation's prompt: one source
from evaluators.grading import extract_boxed

SOURCE = Path(__file__).resolve().parent / "data" / "math_train_l3to5.jsonl"
SOURCE_SHA256 = "ecd6d3ea175c3a6a602ee74895aec0048af9089042d2b4f469166f4980d30651"
DATA_SOURCE = "math_l3to5"


def boxed_gold(solution: str) -> str | None:
    """The content of the last ``\\boxed{}`` of a MATH solution."""
    return extract_boxed(solution)


def load_math_problems(path: Path = SOURCE) -> list[dict]:
    """The shipped problems with a ``gold`` field (rows without a boxed answer are dropped)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            obj = json.loads(line)
            gold = boxed_gold(obj["solution"])
            if gold:
                rows.append({**obj, "gold": gold, "source_index": i})
    return rows


def to_verl_row(obj: dict, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": obj["problem"]},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": obj["gold"]},
        "extra_info": {
            "split": split,
            "index": index,
            "source_index": obj["source_index"],
            "level": obj["level"],
            "type": obj["type"],
        },
    }


def sample_subset(
    n: int = 5000, seed: int = 0, path: Path = SOURCE
) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows): ``n`` problems drawn with ``random.Random(seed)``, the rest held out."""
    problems = load_math_problems(path)
    if not 0 < n <= len(problems):
        raise ValueError(f"cannot draw {n} problems from {len(problems)}")
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    train = [to_verl_row(problems[i], "train", k) for k, i in enumerate(order[:n])]
    val = [to_verl_row(problems[i], "val", k) for k, i in enumerate(order[n:])]
    return train, val


def write_parquet(out_dir: str | Path, n: int = 5000, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` into ``out_dir``; returns their paths."""
    import pandas as pd  # lazy: pandas is heavy (only this path needs it)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, val = sample_subset(n, seed)
    paths = out / "train.parquet", out / "val.parquet"
    for rows, p in zip((train, val), paths):
        pd.DataFrame(rows).to_parquet(p, index=False)
    return paths


if __name__ == "__main__":  # python -m trainer_template.verl_backend.data_prep OUT_DIR [N] [SEED]
    import sys

    if len(sys.argv) < 2:
        sys.exit(
            "usage: python -m trainer_template.verl_backend.data_prep OUT_DIR [N=5000] [SEED=0]"
        )
    n_arg = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    seed_arg = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    for written in write_parquet(sys.argv[1], n=n_arg, seed=seed_arg):
        print(written)
