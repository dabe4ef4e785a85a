"""The six math benchmarks shipped in ``evaluators/data`` (see its PROVENANCE.md), their gold-answer
extraction, and the math6 suite's protocol (the paper's)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from evaluators.errors import SuiteError
from evaluators.grading import extract_boxed, join_answers, normalize_gold, split_dollar_answers

DATA_DIR = Path(__file__).resolve().parent / "data"

SHA256 = {
    "aime24": "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
    "aime25": "3611f1360ce5e8bfe13bee53bff5020de005f1d18152cd594402db58a848a64e",
    "amc83": "1acf00e3602ed7be2ecd77951c56b02e2130e1e3534bb07493a884f60c0699c0",
    "math500": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    "minerva_math": "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
    "olympiadbench": "bb8c1e38a16ea9eacb77530315a674d883f267fbff79183effc53681b4fcc416",
}


@dataclass(frozen=True)
class BenchmarkProblem:
    benchmark: str
    index: int
    problem: str
    gold: str


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of a suite: ``key`` is its metric name, ``dataset`` its folder in ``data/``."""

    key: str
    dataset: str
    problem_field: str
    n: int  # samples per problem
    k: int  # pass@k (k = n = 1: acc@1)
    temperature: float

    @property
    def metric(self) -> str:
        return "acc@1" if self.n == 1 and self.temperature == 0 else f"pass@{self.k}"


def gold_answer(dataset: str, row: dict) -> str:
    """The gold answer of one row, per the dataset's layout."""
    if dataset in ("aime24", "aime25", "amc83", "math500"):
        return normalize_gold(row["answer"])
    if dataset == "minerva_math":
        boxed = extract_boxed(row["solution"])
        if boxed is None:
            raise SuiteError(
                f"minerva_math row without a \\boxed{{}} gold in its solution: {row['problem'][:60]!r}"
            )
        return normalize_gold(boxed)
    if dataset == "olympiadbench":
        parts: list[str] = []
        for ans in row["final_answer"]:
            parts += split_dollar_answers(ans) if row.get("is_multiple_answer") else [ans]
        return join_answers(parts) if len(parts) > 1 else normalize_gold(parts[0])
    raise SuiteError(f"unknown dataset {dataset!r}")


def data_file(dataset: str) -> Path:
    return DATA_DIR / dataset / "test.jsonl"


def _shipped_bytes(dataset: str) -> tuple[bytes, str]:
    """A benchmark file's bytes and sha256, refused (SuiteError) when missing or when it is not the
    shipped file (:data:`SHA256`): a truncated or edited file would be scored on what is left."""
    path = data_file(dataset)
    if not path.is_file():
        raise SuiteError(f"benchmark file missing: {path}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    want = SHA256.get(dataset)
    if want is not None and digest != want:
        raise SuiteError(
            f"benchmark file {path} ({dataset}) is not the shipped one: sha256 {digest[:16]}..., "
            f"expected {want[:16]}... (truncated or modified? reinstall poise-git)"
        )
    return data, digest


def file_sha256(dataset: str) -> str:
    return _shipped_bytes(dataset)[1]


def load_problems(bench: Benchmark, limit: int | None = None) -> list[BenchmarkProblem]:
    data, _ = _shipped_bytes(bench.dataset)
    path = data_file(bench.dataset)
    out = []
    for i, line in enumerate(data.decode("utf-8").split("\n")):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            problem = str(row[bench.problem_field])
        except (ValueError, KeyError, TypeError) as exc:
            raise SuiteError(f"{path}:{i + 1}: not a benchmark row ({exc})") from None
        out.append(BenchmarkProblem(bench.key, i, problem, gold_answer(bench.dataset, row)))
    return out


# The paper's protocol: pass@32 at T=1.0 on AIME24/25 and AMC; acc@1 greedy on the other three; 4,096 tokens.
MAX_TOKENS = 4096
SUITES: dict[str, tuple[Benchmark, ...]] = {
    "math6": (
        Benchmark("aime24", "aime24", "problem", 32, 32, 1.0),
        Benchmark("aime25", "aime25", "question", 32, 32, 1.0),
        Benchmark("amc", "amc83", "problem", 32, 32, 1.0),  # the paper's 83 AMC problems
        Benchmark("math500", "math500", "problem", 1, 1, 0.0),
        Benchmark("minerva", "minerva_math", "problem", 1, 1, 0.0),
        Benchmark("olympiadbench", "olympiadbench", "question", 1, 1, 0.0),
    ),
}
# Presets: "paper" is the protocol; "smoke" shrinks samples and tokens for CPU smoke runs (not comparable).
SUITE_PRESETS = {
    "paper": {"max_samples": None, "max_tokens": MAX_TOKENS},
    "smoke": {"max_samples": 2, "max_tokens": 24},
}


def suite(name: str, preset: str = "paper") -> tuple[tuple[Benchmark, ...], int]:
    """The benchmarks of a suite under a preset, and the generation budget in tokens."""
    if name not in SUITES:
        raise SuiteError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    if preset not in SUITE_PRESETS:
        raise SuiteError(f"unknown suite preset {preset!r}; known: {', '.join(SUITE_PRESETS)}")
    for dataset in dict.fromkeys(b.dataset for b in SUITES[name]):
        _shipped_bytes(dataset)  # a missing or damaged file is refused before anything runs
    cap = SUITE_PRESETS[preset]["max_samples"]
    benches = tuple(
        Benchmark(b.key, b.dataset, b.problem_field, min(b.n, cap), min(b.k, cap), b.temperature)
        if cap
        else b
        for b in SUITES[name]
    )
    return benches, int(SUITE_PRESETS[preset]["max_tokens"])
