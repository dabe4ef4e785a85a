"""Write ``evaluators/data/amc83/test.jsonl`` from the 83-problem AMC split as published (a Hugging Face
``datasets`` Arrow file; see ``evaluators/data/PROVENANCE.md``)::

    python tools/amc83_from_arrow.py PATH/TO/amc83/data-00000-of-00001.arrow

One JSON object per row, in the file's order, with its three fields as they are (``problem``,
``answer`` as a float, ``difficulty``), keys in that order, UTF-8 unescaped; nothing is normalized.
Needs pyarrow (installed with mlflow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

OUT = Path(__file__).resolve().parents[1] / "evaluators" / "data" / "amc83" / "test.jsonl"
FIELDS = ("problem", "answer", "difficulty")


def convert(arrow: Path, out: Path = OUT) -> int:
    with pa.memory_map(str(arrow)) as src:
        table = ipc.open_stream(src).read_all()
    rows = table.to_pylist()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps({k: row[k] for k in FIELDS}, ensure_ascii=False) + "\n")
    return len(rows)


if __name__ == "__main__":
    n = convert(Path(sys.argv[1]))
    sys.stdout.write(f"{n} rows -> {OUT}\n")
