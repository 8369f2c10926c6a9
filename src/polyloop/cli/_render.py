"""Rendering for the commands: rich tables on a terminal, plain lines otherwise."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import AsyncIterable, Sequence
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from polyloop import EscalationReport, RunResult, StepRecord
from polyloop.events import (
    Event,
    ModelCallFinished,
    ModelDelta,
    RunEnded,
    StepAppended,
)
from polyloop.journal import STEP_USAGE_FIELDS
from polyloop.observe.chat_export import REDACTED, redact_arguments
from polyloop.types import TestEdit

console = Console(highlight=False, soft_wrap=False)


def _plain() -> bool:
    return not sys.stdout.isatty()


def _when(epoch: float | None) -> str:
    return "" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _short(text: str | None, width: int = 48) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= width else line[: width - 1] + "…"


PROGRESS_HEADER = f"{'step':<8}  {'action':<44}  {'status':<12} {'step time':>12}"


class Progress:
    """An observer drawing one line per step under a header naming the columns: the step
    number, its action (or answer), the action's status, and the step's own time
    (``step_wall_ms``: model call, interpretation and execution), in milliseconds. A
    streamed reply's text (``run --stream``) is printed as it arrives, on lines of its own
    before its step's line; the text of an attempt that failed is followed by a line saying
    it is not the reply."""

    def __init__(self, *, max_attempts: int | None = None, live: bool | None = None) -> None:
        """``max_attempts``: the retry policy's (default: ``RetryPolicy()``'s, the CLI's);
        ``live``: draw :mod:`._live`'s line of what the run waits for (default: when stdout
        is a terminal). Either way, a model attempt that fails is a line of its own."""
        from polyloop import RetryPolicy

        from ._live import LiveLine, Waiting

        self.headed = False
        self.streaming = False
        self.waiting = Waiting(max_attempts or RetryPolicy().max_attempts)
        use_live = not _plain() if live is None else live
        self.live = LiveLine(console, self.waiting.text) if use_live else None

    def close(self) -> None:
        """Take the live line away (before the command's last lines)."""
        if self.live is not None:
            self.live.close()

    def __call__(self, event: Event) -> None:
        failed = self.follow(event)
        if self.streaming and isinstance(event, ModelCallFinished):  # end the streamed text
            self.streaming = False
            self.line("")
            if failed is not None:  # one line: the note, then the failed attempt's own line
                note = "(that reply was cut off: the attempt failed, and it is not the reply)"
                self.line(f"{note}  {failed.strip()}")
            return
        self._draw(event)
        if failed is not None:
            self.line(failed)

    def follow(self, event: Event) -> str | None:
        """Follow ``event`` for the live line (up while a call or a tool runs, away while a
        reply's text streams and once the run ended); returns the line of a model attempt
        that failed, to print."""
        from ._live import follows, streams

        failed = self.waiting.observe(event)
        if self.live is not None:
            if streams(event):
                self.live.pause()
            elif follows(event):
                self.live.show()
            elif isinstance(event, RunEnded):
                self.live.close()
        return failed

    def _draw(self, event: Event) -> None:
        if isinstance(event, ModelDelta):
            if event.kind == "text":
                self.streaming = True
                print(event.text, end="", flush=True)
        elif isinstance(event, StepAppended):
            s = event.step
            status = s.action_status or ("invalid" if not s.parse_ok else "answer")
            what = s.action or s.parse_error
            if what is None and s.parse_ok:
                what = "final answer: " + s.raw_response
            if not self.headed:
                self.headed = True
                self.line(PROGRESS_HEADER)
            self.line(
                f"step {s.step_idx:>3}  {_short(what or '(model call failed)', 44):<44}  "
                f"{status:<12} {s.step_wall_ms:>9.1f} ms"
            )
        elif isinstance(event, RunEnded):
            self.line(f"stopped: {event.stop_reason}")

    def line(self, text: str) -> None:
        print(text, flush=True)

    def header(self, run_id: str, journal: Path, config: dict[str, Any]) -> None:
        self.line(f"run {run_id}  model {config['model']}  workspace {config['workspace']}")
        self.line(f"journal {journal}")

    def result(self, result: RunResult) -> None:
        self.close()
        self.line(
            f"run {result.run_id}: {result.stop_reason} after {result.steps_used} steps, "
            f"{result.actions_executed} actions"
        )
        if result.stop_detail:
            self.line(f"detail: {result.stop_detail}")
        if result.final_answer:
            self.line(f"answer: {result.final_answer}")
        for line in test_edit_lines(result.test_edits, str(result.stop_reason)):
            self.line(line)

    def parked(self, exc: Any, journal: Path | None) -> None:
        """A run parked until a person decides (``ApprovalRequired``)."""
        self.close()
        where = f" --journal {journal}" if journal else ""
        self.line(
            f"awaiting approval: run {exc.run_id} step {exc.step_idx} wants "
            f"{exc.tool_name or 'an action'} {exc.args_json or ''}"
        )
        self.line(
            f"  approve: polyloop approve {exc.run_id} {exc.op_id}{where}   "
            f"deny: polyloop deny {exc.run_id} {exc.op_id} --reason TEXT{where}   "
            f"then: polyloop resume {exc.run_id}{where}"
        )
        self.line(f"  pending: polyloop pending{where}")

    def detached(self, run_id: str, journal: Path | None) -> None:
        self.close()
        where = f" --journal {journal}" if journal else ""
        self.line(f"detached: run {run_id} stays resumable: polyloop resume {run_id}{where}")


def test_edit_lines(edits: Sequence[TestEdit], stop_reason: str | None) -> list[str]:
    """What a run's edits of test files say to a reader: nothing when there were none; a
    warning first when the run completed after them (its tests may have been weakened)."""
    if not edits:
        return []
    if stop_reason == "task_completed":
        head = "completed after editing test files: check that no test was weakened"
    else:
        head = "test files edited"
    return [f"{head}:", *(f"  {e.describe()}" for e in edits)]


def filter_runs(
    rows: list[dict[str, Any]], *, stop_reason: str | None, since: str | None
) -> list[dict[str, Any]]:
    if stop_reason:
        rows = [r for r in rows if r["stop_reason"] == stop_reason]
    if since:
        try:
            start = time.mktime(time.strptime(since, "%Y-%m-%d"))
        except ValueError:
            from ._badinput import BadInput

            raise BadInput(f"--since takes a date as YYYY-MM-DD, got {since!r}") from None
        rows = [r for r in rows if r["created_at"] >= start]
    return rows


def runs_table(rows: list[dict[str, Any]]) -> None:
    """One line per run; ``state`` is the journal's derived state (running, detached, stale,
    ended), ``request`` the request to end it stored (``stop``, ``cancel``; on an ended run,
    one that came too late or ended it), the counters are current while a run is in
    progress."""
    cols = [
        "run_id",
        "created",
        "state",
        "stop_reason",
        "request",
        "steps",
        "actions",
        *RUN_USAGE_COLUMNS,
        "goal",
    ]
    data = [
        [
            r["run_id"],
            _when(r["created_at"]),
            r.get("state", r["status"]),
            r["stop_reason"] or "",
            r.get("request") or "",
            str(r["steps_used"]),
            str(r["actions_executed"]),
            *run_usage_cells(r),
            _short(r["goal"], 40),
        ]
        for r in rows
    ]
    _table(cols, data, title=f"{len(rows)} runs")


RUN_USAGE_COLUMNS = ["tokens", "cost ($)", "active (s)"]
"""What a run spent, as ``runs`` shows it: ``tokens_used`` (input plus output), ``cost_usd``
and ``active_seconds`` (empty while a run has not ended: only its driver knows it)."""


def _num(value: Any, fmt: str = "") -> str:
    """A number as a cell: empty for None (not known, or not reported)."""
    return "" if value is None else format(value, fmt)


def run_usage_cells(r: dict[str, Any]) -> list[str]:
    """The :data:`RUN_USAGE_COLUMNS` cells of a ``list_runs`` row."""
    return [
        _num(r.get("tokens_used")),
        _num(r.get("cost_usd"), ".6f"),
        _num(r.get("active_seconds"), ".2f"),
    ]


def usage_line(r: dict[str, Any]) -> str:
    """``usage: tokens T (input I, output O, cached C, reasoning R)  cost $X  active S s``, and
    how many replies came with no usage when some did."""
    parts = ", ".join(
        f"{label} {_num(r.get(key))}"
        for label, key in (
            ("input", "input_tokens"),
            ("output", "output_tokens"),
            ("cached", "cached_tokens"),
            ("reasoning", "reasoning_tokens"),
        )
        if r.get(key) is not None
    )
    line = f"usage: tokens {_num(r.get('tokens_used'))}" + (f" ({parts})" if parts else "")
    line += f"  cost ${_num(r.get('cost_usd'), '.6f')}"
    active = r.get("active_seconds")
    line += f"  active {_num(active, '.2f')} s" if active is not None else "  active (not ended)"
    if r.get("usage_missing"):
        line += f"  usage_missing {r['usage_missing']}"
    return line


STEP_USAGE_COLUMNS = ["step", "input tokens", "output tokens", "cached", "reasoning", "cost ($)"]
"""The per-step usage table of ``show``: the step's ``model_calls`` attempts summed (empty:
not reported)."""


def step_usage_rows(
    steps: Sequence[StepRecord], usage: dict[int, dict[str, Any]]
) -> list[list[str]]:
    rows = []
    for s in steps:
        u = usage.get(s.step_idx, {})
        rows.append(
            [
                str(s.step_idx),
                _num(u.get("input_tokens")),
                _num(u.get("output_tokens")),
                _num(u.get("cached_tokens")),
                _num(u.get("reasoning_tokens")),
                _num(u.get("cost_usd"), ".6f"),
            ]
        )
    return rows


SHOW_COLUMNS = ["step", "action", "status", "observation", "prompt (chars)", "time (ms)"]


def show_table(
    run: dict[str, Any], steps: list[StepRecord], usage: dict[int, dict[str, Any]]
) -> None:
    """The run's state, stop reason and what it spent (:func:`usage_line`), what each step's
    model calls spent (:data:`STEP_USAGE_COLUMNS`), then a row per step (``time (ms)`` is
    the step's own ``step_wall_ms``; the last table, as scripts read it)."""
    print(f"run {run['run_id']}  {run.get('state', run['status'])}  {run['stop_reason'] or ''}")
    print(f"goal: {_short(run['goal'], 100)}")
    if run.get("stop_detail"):
        print(f"detail: {run['stop_detail']}")
    request = request_line(run)
    if request:
        print(request)
    print(usage_line(run))
    data = [
        [
            str(s.step_idx),
            _short(s.action or s.parse_error or _no_action(s), 40),
            s.action_status or ("invalid" if not s.parse_ok else "-"),
            _short(s.observation, 40),
            str(s.prompt_chars),
            f"{s.step_wall_ms:.0f}",
        ]
        for s in steps
    ]
    if steps:
        _table(STEP_USAGE_COLUMNS, step_usage_rows(steps, usage), title="usage per step")
    _table(SHOW_COLUMNS, data)
    if run.get("final_answer"):
        print(f"answer: {run['final_answer']}")


def request_line(run: dict[str, Any]) -> str | None:
    """``request: stop by WHO at WHEN (pending): REASON`` for a run with a request stored."""
    kind = run.get("request")
    if not kind:
        return None
    pending = " (pending)" if run["status"] != "ended" else ""
    reason = f": {run['request_reason']}" if run.get("request_reason") else ""
    when = _when(run.get("requested_at"))
    return f"request: {kind} by {run.get('requested_by') or '?'} at {when}{pending}{reason}"


def _no_action(s: StepRecord) -> str:
    """What a step without an action or parse error was: an answer, or (not parsed) a model
    call that failed, as :class:`Progress` names it."""
    return "(final answer)" if s.parse_ok else "(model call failed)"


def show_json(
    run: dict[str, Any],
    steps: list[StepRecord],
    report: EscalationReport | None = None,
    test_edits: Sequence[TestEdit] = (),
    usage: dict[int, dict[str, Any]] | None = None,
    open_action: dict[str, Any] | None = None,
    requests: Sequence[dict[str, Any]] = (),
) -> None:
    """``run`` (the ``list_runs`` row, its usage fields included), ``steps`` (the step
    records as they are), ``usage`` (a row per step with a model call: ``step_idx`` and
    its usage fields), then the report, test edits and ``requests`` (rows of the requests
    table) when there are any."""
    out: dict[str, Any] = {"run": run, "steps": [s.to_dict() for s in steps]}
    out["usage"] = [{"step_idx": i, **u} for i, u in sorted((usage or {}).items())]
    if open_action is not None:
        out["open_action"] = open_action
    if report is not None:
        out["report"] = report.to_dict()
    if requests:
        out["requests"] = list(requests)
    if test_edits:
        out["test_edits"] = [
            {"step_idx": e.step_idx, "path": e.path, "tampering": list(e.tampering)}
            for e in test_edits
        ]
    print(json.dumps(out, ensure_ascii=False, indent=2))


def stats(rows: list[dict[str, Any]]) -> None:
    ended = [r for r in rows if r["status"] == "ended"]
    counts: dict[str, int] = {}
    for r in ended:
        counts[r["stop_reason"]] = counts.get(r["stop_reason"], 0) + 1
    total = len(ended) or 1
    _table(
        ["stop_reason", "runs", "share"],
        [
            [k, str(v), f"{100 * v / total:.1f}%"]
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
        ],
        title=f"{len(ended)} ended runs ({len(rows) - len(ended)} not ended)",
    )
    steps = sorted(r["steps_used"] for r in ended)
    if steps:
        qs = _quantiles(steps)
        print(
            f"steps per run: p50 {qs[49]:.0f}  p90 {qs[89]:.0f}  p99 {qs[98]:.0f}  max {steps[-1]}"
        )
    data = []
    for reason in sorted(counts, key=lambda k: -counts[k]):
        runs = [r for r in ended if r["stop_reason"] == reason]
        for key, fmt in STATS_MEASURES:
            values = sorted(r[key] for r in runs if r.get(key) is not None)
            if not values:
                continue
            qs = _quantiles(values)
            cells = [format(v, fmt) for v in (qs[49], qs[89], qs[98], values[-1], sum(values))]
            data.append([reason, key, str(len(values)), *cells])
    if data:
        _table(STATS_COLUMNS, data, title="spent per run, by stop reason")


STATS_MEASURES = (("tokens_used", ".0f"), ("cost_usd", ".6f"), ("active_seconds", ".2f"))
"""What ``stats`` gives percentiles of per stop reason: the ``runs`` totals, by their names."""
STATS_COLUMNS = ["stop_reason", "measure", "runs", "p50", "p90", "p99", "max", "total"]


def _quantiles(values: Sequence[float]) -> list[float]:
    """The 99 percentile cut points of sorted ``values`` (inclusive method)."""
    if len(values) == 1:
        return [float(values[0])] * 99
    return statistics.quantiles(values, n=100, method="inclusive")


def export_row(
    run: dict[str, Any], step: StepRecord, usage: dict[str, Any] | None, *, redact: bool
) -> dict[str, Any]:
    """One exported step: its run's fields (``run_status`` is the run's ``status``; the run's
    totals ``tokens_used``, ``run_cost_usd`` (the run's ``cost_usd``), ``active_seconds``,
    ``usage_missing``), the step record's fields, then what the step's model calls spent
    (``input_tokens``, ``output_tokens``, ``cached_tokens``, ``reasoning_tokens``,
    ``cost_usd``: None when not reported). The same names in every format."""
    row: dict[str, Any] = {
        "run_id": run["run_id"],
        "goal": run["goal"],
        "stop_reason": run["stop_reason"],
        "run_status": run["status"],
        "created_at": run["created_at"],
        "tokens_used": run.get("tokens_used"),
        "run_cost_usd": run.get("cost_usd"),
        "active_seconds": run.get("active_seconds"),
        "usage_missing": run.get("usage_missing"),
        **step.to_dict(),
        **{name: (usage or {}).get(name) for name in STEP_USAGE_FIELDS},
    }
    if redact:
        row["goal"] = REDACTED
        for key in ("raw_response", "observation", "parse_error"):
            if row[key] is not None:
                row[key] = REDACTED
        if step.tool_args_json is not None:
            row["tool_args_json"] = redact_arguments(step.tool_args_json)
            row["action"] = f"{step.tool_name}(…)"
        elif row["action"] is not None:
            row["action"] = REDACTED
    return row


STEP_ROWS_PER_GROUP = 4096
"""Steps per Parquet row group of the step export: what is held before it is written."""

_RUN_KINDS = {"created_at": "float", "run_cost_usd": "float", "active_seconds": "float"}
_RUN_KINDS |= {"tokens_used": "int", "usage_missing": "int", "cost_usd": "float"}


def _step_schema(names: Sequence[str]) -> Any:
    """The Parquet schema of the step export's columns ``names``: each column's type from the
    step record's field, the run total or the usage field it holds (text otherwise), so every
    row group has the same."""
    import dataclasses

    import pyarrow as pa

    kinds = {f.name: str(f.type).split(" |")[0] for f in dataclasses.fields(StepRecord)}
    kinds |= _RUN_KINDS | {name: "int" for name in STEP_USAGE_FIELDS if name != "cost_usd"}
    types = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    return pa.schema([(name, types.get(kinds.get(name, ""), pa.string())) for name in names])


async def write_export(rows: AsyncIterable[dict[str, Any]], fmt: str, out: IO[Any]) -> int:
    """Write the step export's ``rows`` to ``out`` as they come: JSON Lines (sorted keys), or
    Parquet (``out`` binary) in row groups of :data:`STEP_ROWS_PER_GROUP` steps. Returns the
    number of steps. After a failure the file may be partly written."""
    if fmt != "parquet":
        n = 0
        async for r in rows:
            out.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
        return n
    writer: Any = None
    batch: list[dict[str, Any]] = []
    n = 0
    try:
        async for r in rows:
            batch.append(r)
            n += 1
            if len(batch) == STEP_ROWS_PER_GROUP:
                writer = _group(writer, batch, out)
                batch = []
        if batch or writer is None:
            writer = _group(writer, batch, out)
    finally:
        if writer is not None:
            writer.close()
    return n


def _group(writer: Any, batch: list[dict[str, Any]], out: IO[Any]) -> Any:
    """``batch`` written as one row group (the writer opened on the first, its schema from
    the first row's columns); returns the writer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if writer is None:
        writer = pq.ParquetWriter(out, _step_schema(list(batch[0]) if batch else []))
    writer.write_table(pa.Table.from_pylist(batch, schema=writer.schema))
    return writer


def _table(cols: list[str], data: list[list[str]], title: str | None = None) -> None:
    if _plain():
        if title:
            print(title)
        print("\t".join(cols))
        for row in data:
            print("\t".join(row))
        return
    table = Table(title=title, show_lines=False)
    for c in cols:
        table.add_column(c, overflow="fold")
    for row in data:
        table.add_row(*(Text(cell) for cell in row))  # cells are text, never Rich markup
    console.print(table)


_HINTS = ("readOnlyHint", "idempotentHint", "destructiveHint", "openWorldHint")


def mcp_tool_line(tool: Any, width: int = 28) -> str:
    """One line of ``polyloop tools``: the name, the derived replay policy, the hints the
    server set (``readOnly``, ``!destructive`` for a hint set false), the description's first
    line."""
    hints = []
    for key in _HINTS:
        value = tool.annotations.get(key)
        if isinstance(value, bool):
            hints.append(("" if value else "!") + key.removesuffix("Hint"))
    shown = ",".join(hints) if hints else "(no annotations)"
    description = (tool.description.strip().splitlines() or [""])[0]
    if len(description) > 80:
        description = description[:79] + "…"
    return f"{tool.name:<{width}}  {tool.replay.value:<10}  {shown:<45}  {description}".rstrip()
