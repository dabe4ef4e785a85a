"""Archive verbs: init, spawn, log, show, diff, record."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.tree import Tree

from engine.archive.confirmation import (
    Confirmation,
    other_protocol_version,
    read_confirmation,
    read_confirmations,
)
from engine.archive.edit import apply_edit, check_bounds, decode_source
from engine.archive.results import (
    RECORD_MAX_BYTES,
    RECORD_MAX_METRICS,
    UNITS,
    EvaluationResult,
    ProtocolRef,
    from_record,
    seeds_phrase,
)
from engine.archive.store import ALGORITHM, Archive, Node, check_name
from engine.cli import EXIT_REJECTED, ArchiveOpt, console, err_console, fail, plain
from engine.cli.confirm_cmds import VERDICT_COLOURS
from engine.cli.operator_cmds import make_llm, print_usage, report_verification
from engine.config import parse_config
from engine.errors import ArchiveError, EditError, PoiseError
from engine.untrusted import visible


def _read_text(path: Path, what: str, max_bytes: int | None = None) -> str:
    if path.is_dir():
        raise PoiseError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise PoiseError(f"{what} {path} does not exist")
    if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
        raise PoiseError(
            f"{what} {path} is {size / 1e6:.1f} MB; at most {max_bytes / 1e6:g} MB is read"
        )

    return decode_source(path.read_bytes(), f"{what} {path}")


def _interval_head(kind: str) -> str:
    """The interval column's head: ``interval (95% Student-t over seeds)`` where the kind
    names its level, else ``95% interval (KIND)`` (the level results are recorded at)."""
    if re.match(r"\d+(\.\d+)?%", kind):
        return f"interval ({escape(kind)})"
    return f"95% interval ({escape(kind or 'none')})"


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


_STATUS_STYLE = {
    "evaluated": "green",
    "verified": "cyan",
    "spawned": "white",
    "rejected": "red",
    "failed": "red",
    "evaluating": "yellow",
}


def _held_out(c: Confirmation | None, other_version: str = "") -> str:
    """The label's held-out mark: the confirmation's verdict and difference against its reference,
    its seeds and the protocol version it measured; ``other_version`` (the compared version's key,
    when the confirmation measured another) marks it as not the compared protocol's."""
    if c is None:
        return ""
    style = VERDICT_COLOURS.get(c.verdict, "yellow")
    diff = "" if c.difference is None else f" {c.difference:+.4f}"
    mark = (
        f" [yellow]\\[another protocol version than {escape(other_version)}][/]"
        if other_version
        else ""
    )
    return (
        f"  held out vs {escape(c.against)}: [{style}]{c.verdict}{diff}[/] "
        f"({len(c.seeds)} seed{'' if len(c.seeds) == 1 else 's'}, {escape(c.protocol.key)}){mark}"
    )


def _confirmation_json(c: Confirmation | None, other_version: str = "") -> dict | None:
    if c is None:
        return None
    return {
        "against": c.against,
        "verdict": c.verdict,
        "difference": c.difference,
        "interval": list(c.interval) if c.interval else None,
        "seeds": list(c.seeds),
        "protocol": c.protocol.key,
        # the compared protocol version where the confirmation measured another one, else null
        "other_version_than": other_version or None,
    }


def _label(
    n: Node,
    full: bool = False,
    confirmation: Confirmation | None = None,
    other_version: str = "",
) -> str:
    style = _STATUS_STYLE.get(n.status, "white")
    r, extra = n.result, ""
    if r is not None and r.ok:
        extra = f"  {r.utility} [bold]{_fmt(r.value)}[/]"
    elif (other := _other_value(n)) is not None:  # only under other protocols: which, in what unit
        where = f"{other.protocol.id}, {other.unit(other.utility)}"
        extra = f"  {other.utility} {_fmt(other.value)} [dim]({escape(where)})[/]"
    others = sorted(set(n.results) - ({r.protocol.id} if r is not None else set()))
    if len(others) > (0 if r is not None else 1):
        extra += f"  [dim]\\[results under: {escape(', '.join(others))}][/]"
    if n.stale is not None:
        extra += "  [dim](evaluated under an older protocol version)[/]"
    if n.unreadable:  # a hand-edited results file is not "no results": name it
        extra += f"  [red]({escape(', '.join(sorted(n.unreadable)))} unreadable)[/]"
    reason = n.trailer("Poise-Reason")
    if reason and not full:
        reason = reason[:60] + ("…" if len(reason) > 60 else "")
    why = f"  [dim]({escape(reason)})[/]" if reason and n.status in ("rejected", "failed") else ""
    held = _held_out(confirmation, other_version)
    return f"[bold]{escape(n.name)}[/]  [{style}]{n.status}[/]{extra}{held}{why}"


def _other_value(n: Node) -> EvaluationResult | None:
    """The result ``log`` shows for a node with none under the compared protocol: its latest
    evaluated one under another protocol (None when it has none)."""
    if n.result is not None or not n.results:
        return None
    other = max(n.results.values(), key=lambda x: x.recorded_at)
    return other if other.ok else None


def _units_note(nodes: dict[str, Node], ref: ProtocolRef) -> str:
    """What ``log``'s values are: where every value shown is the compared protocol's, that protocol,
    the unit and the seeds ("" where no value is shown); where some are under other protocols (each
    of those is marked with its protocol and unit), which ones the unmarked values are."""
    ours = [r for n in nodes.values() if (r := n.result) is not None and r.ok]
    if not any(_other_value(n) is not None for n in nodes.values()):
        if not ours:
            return ""
        units = ", ".join(sorted({r.unit(r.utility) for r in ours}))
        counts = sorted({len(r.seeds) for r in ours})
        n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        return (
            f"values: {ours[0].utility} under {ours[0].protocol.key} ({units}), each node's mean "
            f"over its {n} seed{'s' * (counts[-1] != 1)}"
        )
    if not ours:
        return (
            f"no node has a result under {ref.id} (choose another with --protocol): each value is "
            "under the protocol beside it, in its unit; values under different protocols are not "
            "comparable"
        )
    units = ", ".join(sorted({r.unit(r.utility) for r in ours}))
    return (
        f"values without a protocol beside them: {ours[0].utility} under {ref.id} ({units}); the "
        "others are under the protocol beside each, in its unit, and not comparable with them"
    )


ProtocolOpt = typer.Option(
    None,
    "--protocol",
    help="Compare results under this protocol id (default: the experiment's, e.g. proxy/default).",
)


def init(
    directory: Path = typer.Argument(
        ..., help="Where to create the experiment repository (new or empty)."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="A poise.toml to start from (default: the built-in one)."
    ),
    root: Path | None = typer.Option(
        None,
        "--root",
        help="An algorithm.py of your own as the root (e.g. a found node's, to search on from it); "
        "default: the GRPO baseline.",
    ),
    root_name: str | None = typer.Option(
        None, "--root-name", help="The root node's name (default grpo; with --root: root)."
    ),
) -> None:
    """Create an experiment repository with its root node: by default [bold]poise/grpo[/], the GRPO
    baseline.

    With --root FILE the root holds that algorithm.py instead, checked against the shared interface;
    it is verified like any candidate before its first evaluation (`poise-git run` does it)."""
    create_archive(directory, config, root, root_name)


def create_archive(
    directory: Path, config: Path | None, root: Path | None, root_name: str | None
) -> Archive:
    """A new archive (``init``, and ``run`` on a directory that does not exist yet): ``config``
    validated and ``root`` checked against the interface before anything is created; says what
    it made."""
    toml = _read_text(config, "config file") if config else None
    if toml is not None:
        parse_config(toml, str(config))
    algorithm = _read_text(root, "root algorithm") if root else None
    if root_name is not None and not root_name.strip():
        raise PoiseError("--root-name is empty: name the root node, or leave the option out")
    name = root_name or ("root" if root else "grpo")
    check_name(name)
    try:
        arch = Archive.init(directory, config_toml=toml, algorithm=algorithm, root_name=name)
    except EditError as exc:
        raise PoiseError(f"--root {root}: {exc}") from None  # nothing was created
    console.print(
        f"Initialized poise-git archive in [bold]{plain(arch.path)}[/] with root node [bold]{name}[/] "
        f"(branch poise/{name})"
        + (
            f", the code of {root}; `poise-git verify {name}` or `poise-git run` verifies it"
            if root
            else ""
        )
    )
    return arch


def spawn(
    parent: str = typer.Argument(..., help="The parent node."),
    name: str | None = typer.Option(
        None,
        "--name",
        help="The new node's name (its branch is poise/NAME); optional with --auto and --prior.",
    ),
    edit: Path | None = typer.Option(
        None,
        "--edit",
        help="A Python file of top-level definitions replacing / extending the parent's algorithm.py.",
    ),
    prior: str | None = typer.Option(
        None,
        "--prior",
        help="Seed a published mechanism (trainer_template/priors): its edit over PARENT, its card as "
        "PROPOSAL.md; the name defaults to the prior's.",
    ),
    proposal: Path | None = typer.Option(
        None, "--proposal", help="PROPOSAL.md for the node (motivation, method, expected effect)."
    ),
    auto: bool = typer.Option(
        False,
        "--auto",
        help="Propose, implement and verify in one go (the best screened proposal).",
    ),
    proposer: str | None = typer.Option(
        None, "--proposer", help="With --auto: offline (no API key) | llm (default: poise.toml)."
    ),
    replay: bool = typer.Option(
        False, "--replay", help="With --auto: answer LLM calls from the archive's records only."
    ),
    seed: int | None = typer.Option(None, "--seed", help="With --auto: the proposer's seed."),
    no_verify: bool = typer.Option(
        False,
        "--no-verify",
        help="With --edit or --prior: skip the static checks and generated tests (status stays spawned).",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Spawn even when the result is the same mechanism as an existing node.",
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Fork a candidate off PARENT with a LibCST edit of its algorithm.py (verified), with --prior (a
    published mechanism's edit), or with --auto.

    An edit whose result is the same mechanism as an existing node (same code up to formatting,
    comments and docstrings) is refused with that node's name unless --force is given.
    Exit code 3 when verification rejects the candidate."""
    if auto:
        return _spawn_auto(parent, name, proposer, replay, seed, archive)
    files = None
    if prior is not None:
        name, edit_src, proposal_src, trailers, files = _prior_edit(prior, name, edit)
    else:
        edit_src = _read_text(edit, "edit file") if edit else None
        proposal_src = None
        trailers = {"Poise-Proposer": "manual"} if edit_src is not None else None
    if name is None:
        raise typer.BadParameter("Missing option '--name' (required unless --auto or --prior).")
    if edit is not None and edit_src is not None:
        check_syntax(edit_src, edit)
    if proposal is not None:
        proposal_src = _read_text(proposal, "proposal file")
    arch = Archive(archive)
    check_name(name)
    if arch.exists(name):  # said before the mechanism is compared: --force would not help
        raise PoiseError(f"a node named {name!r} already exists")
    started = time.perf_counter()  # the spawn's time: the duplicate check and the commit
    if edit_src is not None and not force and arch.exists(parent):
        _refuse_duplicate(arch, parent, name, edit_src)
    node = arch.spawn(parent, name, edit_src, proposal=proposal_src, trailers=trailers, files=files)
    spawn_ms = (time.perf_counter() - started) * 1e3
    console.print(
        f"spawned [bold]{node.name}[/] from [bold]{parent}[/] at {node.commit[:10]} "
        f"(spawn {spawn_ms:.0f} ms)"
    )
    written = arch.diff(parent, name, stat=True, written_only=True)
    console.print(written.rstrip(), highlight=False, markup=False)
    if edit_src is not None and not no_verify:
        from engine.operators.verify import verify_node  # lazy: keeps `poise-git --help` fast

        try:
            started = time.perf_counter()
            with console.status(f"verifying {name}…"):
                res = verify_node(arch, name, arch.config())
            verify_s = time.perf_counter() - started
        except KeyboardInterrupt:  # the node is committed: say how to finish, then stop as usual
            err_console.print(
                f"{name} stays spawned, unverified: `poise-git verify {name}` verifies it",
                highlight=False,
                markup=False,
            )
            raise
        report_verification(name, res, verify_s)


def _prior_edit(prior: str, name: str | None, edit: Path | None):
    """(name, edit, proposal, trailers, files) that seed the published mechanism ``prior``; the
    catalog's component record comes along where the offline catalog expresses the prior exactly."""
    # lazy: torch is heavy (only this path needs it)
    from engine.operators.proposers.offline import prior_record

    # lazy: keeps `poise-git --help` fast
    from trainer_template.priors import list_priors, prior_card, prior_edit

    if edit is not None:
        raise PoiseError("--prior and --edit both give the edit: use one")
    if prior not in list_priors():
        raise PoiseError(f"unknown prior {prior!r}; known: {', '.join(list_priors())}")
    trailers = {"Poise-Proposer": "prior", "Poise-Prior": prior}
    record = prior_record(prior)
    files = (
        {"records/proposal.json": json.dumps(record, indent=1, sort_keys=True)} if record else None
    )
    return name or prior, prior_edit(prior), prior_card(prior), trailers, files


def check_syntax(source: str, path: Path) -> None:
    """Refuse a Python file that does not parse, in one line naming its file, line and column as
    Python does (``File "e.py", line 3, column 9``) and quoting the offending line. The parser bounds
    (size, NUL bytes, nesting, operator chains) come first: ``compile`` itself recurses on deep code."""
    check_bounds(source, "the edit")
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f'File "{exc.filename or path}", line {exc.lineno}'
        if exc.offset:
            where += f", column {exc.offset}"
        code = (exc.text or "").strip()
        raise EditError(
            f"syntax error in the edit: {where}: {exc.msg}" + (f": {code}" if code else "")
        ) from None
    except ValueError as exc:  # e.g. a NUL byte
        raise EditError(f'syntax error in the edit: File "{path}": {exc}') from None


def _refuse_duplicate(arch: Archive, parent: str, name: str, edit_src: str) -> None:
    """An edit that recreates an existing node's mechanism is an error unless --force."""
    from engine.archive.mechanism import same_mechanism  # lazy: keeps `poise-git --help` fast

    new_src = apply_edit(arch.algorithm(parent), edit_src)
    same = same_mechanism(arch, new_src)
    if same:
        shown = ", ".join(same[:5]) + (f" and {len(same) - 5} more" if len(same) > 5 else "")
        raise PoiseError(
            f"{name!r} would be the same mechanism as the existing node {shown} "
            "(identical algorithm.py up to formatting, comments and docstrings); "
            "use --force to spawn it anyway"
        )


def _spawn_auto(
    parent: str,
    name: str | None,
    proposer: str | None,
    replay: bool,
    seed: int | None,
    archive: Path,
) -> None:
    from engine.operators.implement import implement  # lazy: keeps `poise-git --help` fast
    from engine.operators.propose import propose_all  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    cfg = arch.config()
    llm = make_llm(arch, cfg, proposer, replay)
    with console.status(f"proposing children of {parent}…"):
        kept, dropped = propose_all(arch, parent, cfg, None, proposer, seed, llm=llm, replay=replay)
    if not kept:
        why = "; ".join(f"{p.name}: {p.screening.get('reason', '?')}" for p in dropped[:3])
        fail(
            f"no proposal for {parent} survived screening ({why or 'none proposed'})",
            EXIT_REJECTED,
        )
    best = kept[0]
    console.print(
        f"best proposal [bold]{best.name}[/] (score {best.score:.3f}): {escape(best.mechanism[:200])}"
    )
    with console.status(f"implementing and verifying {best.name}…") as status:
        node = implement(
            arch, parent, best, cfg, name=name, llm=llm, progress=lambda msg: status.update(msg)
        )
    print_usage(llm)
    if node.status == "verified":
        console.print(
            f"spawned [bold]{node.name}[/] from [bold]{parent}[/] at {node.commit[:10]}: [cyan]verified[/]"
        )
        return
    console.print(
        f"spawned [bold]{node.name}[/] from [bold]{parent}[/]: [red]{node.status}[/]: "
        f"{escape(node.trailer('Poise-Reason') or '')}"
    )
    raise typer.Exit(EXIT_REJECTED)


def log(
    archive: Path = ArchiveOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    protocol: str | None = ProtocolOpt,
) -> None:
    """Draw the lineage tree: node, status, its utility under the compared protocol and, where it has
    one, its held-out confirmation under that protocol (marked where it measured another version of
    the protocol than the compared one)."""
    arch = Archive(archive)
    nodes = arch.nodes(protocol)
    ref = arch.protocol_ref(protocol)
    confs = read_confirmations(arch, nodes, ref.id)
    apart = {
        k: other_protocol_version(c, ref, nodes[k].result or nodes[k].stale)
        for k, c in confs.items()
    }
    if as_json:
        rows = [
            {
                "node": n.name,
                "parents": list(n.parents),
                "status": n.status,
                "depth": n.depth,
                "overall": n.overall,
                "protocol": n.result.protocol.key if n.result is not None else None,
                "results": {  # a number with what it measured
                    pid: {
                        "status": r.status,
                        r.utility: r.value,
                        "unit": r.unit(r.utility),
                        "interval": list(iv) if (iv := r.interval(r.utility)) else None,
                        "interval_kind": r.interval_kind,
                        "seeds": list(r.seeds),
                        "protocol": r.protocol.key,
                    }
                    for pid, r in sorted(n.results.items())
                },
                "confirmation": _confirmation_json(confs.get(n.name), apart.get(n.name, "")),
                "commit": n.commit,
            }
            for n in sorted(nodes.values(), key=lambda n: n.created)
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    kids: dict[str, list[Node]] = {}
    roots = []
    for n in sorted(nodes.values(), key=lambda n: n.created):
        if n.parents and n.parents[0] in nodes:
            kids.setdefault(n.parents[0], []).append(n)
        else:
            roots.append(n)
    full = not console.is_terminal  # piped: reasons in full, nothing wrapped
    for root in roots:
        tree = Tree(_label(root, full, confs.get(root.name), apart.get(root.name, "")))
        stack = [(root, tree)]
        while stack:
            n, t = stack.pop()
            for c in kids.get(n.name, []):
                extra = f"  [dim](× {', '.join(c.parents[1:])})[/]" if len(c.parents) > 1 else ""
                label = _label(c, full, confs.get(c.name), apart.get(c.name, ""))
                stack.append((c, t.add(label + extra)))
        console.print(tree)
    if note := _units_note(nodes, ref):
        console.print(f"[dim]{escape(note)}[/]", highlight=False)


def show(
    node: str = typer.Argument(..., help="The node to show."), archive: Path = ArchiveOpt
) -> None:
    """Show a node: proposal, mechanism diff vs its parent, results and reflection.

    Piped or redirected, the sections are written as plain text, never cut or wrapped."""
    from engine.cli.render import piped, raw, section  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    n = arch.node(node)
    head = (
        f"{n.name}  status {n.status}  depth {n.depth}  "
        f"parents {', '.join(n.parents) or '—'}  commit {n.commit}"
    )
    if piped():
        raw(head)
    else:
        console.print(Panel(head, expand=False), highlight=False, markup=False)
    reason = n.trailer("Poise-Reason")
    if reason:
        console.print(f"[red]reason:[/] {escape(reason)}", highlight=False)
    proposal = arch.read_file(node, "PROPOSAL.md")
    if proposal:
        section("PROPOSAL.md", proposal, "markdown")
    if n.parent:
        diff, against = arch.parent_diff(node, [ALGORITHM])
        section(f"mechanism diff vs {against}", diff or "(no change)", "diff")
    for _pid, r in sorted(n.results.items()):
        seeds = seeds_phrase(r.seeds)
        title = f"results under {r.protocol.key} ({r.status}; {seeds})"
        if r.legacy:
            title += " [read from a schema-1 results.json]"
        if piped():
            raw(f"== {title} ==")
        table = Table(
            title=None if piped() else escape(title), show_header=True, title_justify="left"
        )
        table.add_column("metric", overflow="fold")
        table.add_column("value", justify="right")
        table.add_column("unit")
        table.add_column(_interval_head(r.interval_kind), justify="right")
        for k, v in sorted(r.metrics.items()):
            iv = r.interval(k)
            table.add_row(k, _fmt(v), r.unit(k), f"[{_fmt(iv[0])}, {_fmt(iv[1])}]" if iv else "")
        console.print(table)
        if not r.ok:
            console.print(f"[red]failed:[/] {escape(r.reason)}", highlight=False)
    for path, why in sorted(n.unreadable.items()):
        console.print(f"[red]{escape(path)} is unreadable:[/] {escape(why)}", highlight=False)
    for pid in sorted(n.results):
        try:
            conf = read_confirmation(arch, node, pid)
        except ArchiveError as exc:
            console.print(
                f"[red]held-out confirmation under {pid}:[/] {escape(str(exc))}", highlight=False
            )
            continue
        if conf is not None:
            other = other_protocol_version(conf, ProtocolRef(pid), n.results[pid])
            mark = f" [another protocol version than its result's, {other}]" if other else ""
            console.print(
                f"held-out confirmation under {conf.protocol.key}{mark}: {conf.describe()}",
                highlight=False,
                markup=False,
            )
    reflection = arch.read_file(node, "REFLECTION.md")
    if reflection:
        section("REFLECTION.md", reflection, "markdown")


def diff(
    a: str = typer.Argument(..., help="First node."),
    b: str = typer.Argument(..., help="Second node."),
    all_files: bool = typer.Option(
        False, "--all", help="Diff every file, not only the mechanism (algorithm.py)."
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """The mechanism diff between any two nodes (algorithm files by default)."""
    arch = Archive(archive)
    out = arch.diff(a, b, None if all_files else [ALGORITHM])
    typer.echo(visible(out) if out else "(no difference)", nl=not out)


def record(
    node: str = typer.Argument(..., help="The node the metrics belong to."),
    results: Path = typer.Option(
        ...,
        "--results",
        help="A JSON object of metric name -> number, or {metrics, units, intervals, seeds, "
        f"protocol}} (at most {RECORD_MAX_BYTES / 1e6:g} MB and {RECORD_MAX_METRICS} metrics).",
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="The protocol id the metrics were measured under (ranked only against the same id); "
        "default: the file's protocol, else external. Refused when it differs from the file's.",
        show_default=False,
    ),
    unit: str | None = typer.Option(
        None,
        "--unit",
        help=f"Unit of metrics the file gives none for: {' | '.join(UNITS)} (default value).",
        show_default=False,
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Record externally obtained metrics on a node, under their own protocol id."""
    text = _read_text(results, "results file", max_bytes=RECORD_MAX_BYTES)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArchiveError(f"{results} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ArchiveError(f"{results} nests too deeply to be a results file") from None
    arch = Archive(archive)
    result = from_record(
        payload, protocol=protocol, unit=unit, utility=arch.config().experiment.objective
    )
    commit = arch.record_result(node, result)
    console.print(
        f"recorded {len(result.metrics)} metrics on [bold]{node}[/] under "
        f"{result.protocol.id} at {commit[:10]}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    for fn in (init, spawn, log, show, diff, record):
        app.command()(fn)
