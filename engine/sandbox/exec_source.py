"""Run a Python file inside the sandbox: ``python -m engine.sandbox.exec_source FILE``.

Used by the boundary's self-check (``python -m engine.sandbox``) and by the hostile corpus's tests,
which run raw code behind the boundary as if the static check had missed it. Sends ``{"type":
"done"}`` on the channel when the file ran to its end.
"""

from __future__ import annotations

import sys

from trainer_template.channel import Channel


def main() -> None:
    path = sys.argv[1]
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    scope = {"__name__": "__sandboxed__", "CHANNEL": Channel.from_env()}
    exec(compile(source, path, "exec"), scope)
    if scope["CHANNEL"] is not None:
        scope["CHANNEL"].send({"type": "done"})


if __name__ == "__main__":
    main()
