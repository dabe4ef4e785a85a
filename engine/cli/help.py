"""Examples shown under each verb's ``--help`` and the exit codes under ``poise-git --help``.

Kept in one table so every verb has examples and the exit codes are stated once (the README and
docs/cli.md repeat them; tests/test_cli.py checks that they agree with ``engine.cli``).
"""

from __future__ import annotations

from rich.markup import escape

EXIT_CODES = (
    (0, "success"),
    (1, "error: bad input, unknown node, invalid poise.toml, a failed LLM endpoint or git"),
    (2, "usage error: unknown option, missing or malformed argument"),
    (3, "the candidate was rejected (verification failed, or no proposal survived screening)"),
    (4, "the candidate failed its evaluation (raised, NaN/inf, collapsed)"),
    (130, "interrupted (Ctrl-C, SIGINT)"),
    (143, "stopped by SIGTERM (kill, a scheduler); SIGHUP (a closed terminal) exits 129"),
)

_EXAMPLES: dict[str, list[str]] = {
    "init": [
        "poise-git init exp",
        "poise-git init exp --config my-poise.toml",
        "git -C exp show poise/NODE:algorithm.py > found.py",
        "poise-git init exp2 --root found.py --root-name found   # search on from a found node",
    ],
    "spawn": [
        "poise-git spawn grpo --name clip-wide --edit clip.py --proposal clip.md -C exp",
        "poise-git spawn grpo --name again --edit clip.py --force   # same mechanism as a node",
        "poise-git spawn grpo --auto --proposer offline -C exp",
        "poise-git spawn grpo --prior dr_grpo -C exp   # a published mechanism (its edit and card)",
    ],
    "log": [
        "poise-git log -C exp",
        "poise-git log --json -C exp | jq '.[] | select(.confirmation) | .node'",
    ],
    "show": ["poise-git show clip-wide -C exp", "poise-git show clip-wide > clip-wide.txt"],
    "diff": ["poise-git diff grpo clip-wide", "poise-git diff grpo clip-wide --all | less"],
    "compare": [
        "poise-git compare -C exp",
        "poise-git compare grpo clip-wide --sort hard/pass@8",
        "poise-git compare --status evaluated --protocol proxy --metrics 'hard/*'",
        "poise-git compare --csv > nodes.csv",
    ],
    "record": [
        "poise-git record clip-wide --results metrics.json",
        "poise-git record clip-wide --results lab.json --protocol lab-eval/v1 --unit percent",
    ],
    "evaluate": [
        "poise-git evaluate clip-wide --seeds 4 -C exp",
        "poise-git evaluate grpo --preset smoke",
        "poise-git evaluate clip-wide --suite math6 --generator openai --model m --base-url URL",
    ],
    "select": [
        "poise-git select --k 3 --explain -C exp",
        "poise-git select --json --protocol proxy/smoke",
    ],
    "retrospect": ["poise-git retrospect -C exp", "poise-git retrospect --json"],
    "train": ["poise-git train clip-wide --backend verl --dry-run"],
    "propose": [
        "poise-git propose grpo --n 4 --proposer offline",
        "poise-git propose grpo --proposer llm --replay --json",
    ],
    "verify": ["poise-git verify clip-wide -C exp   # exit 3 when rejected"],
    "reflect": ["poise-git reflect clip-wide", "poise-git reflect clip-wide --no-llm"],
    "run": [
        "poise-git run -C exp --rounds 2 --parents 2 --population 2",
        "poise-git run -C exp --budget wall=90m --budget candidates=40",
        "poise-git run -C exp --resume",
        "poise-git run -C exp --rounds 2 --seeds 2 --confirm-seeds 2",
    ],
    "confirm": [
        "poise-git confirm grpo-entropycontrol-dynamic -C exp",
        "poise-git confirm clip-wide --against grpo --seeds 4 -C exp",
    ],
    "ablate": [
        "poise-git ablate grpo-kl0-1-clip0-331 -C exp",
        "poise-git ablate clip-wide --json ablation.json",
    ],
    "report": ["poise-git report -C exp", "poise-git report -C exp --out /tmp/report"],
    "ui": ["poise-git ui -C exp --port 5001"],
    "drop": [
        "poise-git drop clip-wide -C exp",
        "poise-git drop clip-wide --with-descendants",
        "poise-git drop clip-wide --undo            # the same as: poise-git restore clip-wide",
    ],
    "restore": ["poise-git restore clip-wide -C exp", "poise-git restore --list"],
    "gc": ["poise-git gc -C exp --dry-run", "poise-git gc -C exp --older-than 7"],
}


def examples(name: str) -> str | None:
    """The epilog of one verb: its examples, one per line (rich markup escaped)."""
    lines = _EXAMPLES.get(name)
    if not lines:
        return None
    return "[bold]Examples[/]\n" + "\n".join(f"  {escape(line)}" for line in lines)


EXAMPLES = {name: examples(name) for name in _EXAMPLES}

ROOT_EPILOG = (
    "[bold]Exit codes[/]\n"
    + "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES)
    + "\n\nRun `poise-git COMMAND --help` for a command's options and examples."
)
