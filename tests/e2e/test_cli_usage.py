"""End-to-end: what researchers budget for (tokens: input, output, cached, reasoning; cost;
active seconds), per step and per run, in every reader of the ``polyloop`` command: ``show``
(table and ``--json``), ``runs``, ``stats``, ``export`` (jsonl and parquet, the same fields),
``report`` and ``view``. Each number shown is checked against what the journal recorded
(the ``runs`` and ``model_calls`` tables, read with plain SQL).

The journal holds a run made by ``polyloop run`` against the fake OpenAI-compatible server
(which reports usage with cached and reasoning tokens), and a priced run that was detached
and then ended by ``polyloop stop`` while nobody advanced it (its totals come from its
attempts)."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from polyloop import Loop, ModelReply, Pricing, RunDetached, ToolCall, Usage
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest
from tests.durability.test_stop_requests import LONG, Gate
from tests.e2e import test_cli as base
from tests.e2e.test_cli import CLI, SlowableServer, run_args, run_id_of, runs_rows
from tests.fakes.openai_server import completion, tool_call
from tests.viewer.serve import serving

pytest.importorskip("typer")
pytest.importorskip("openai")

# The fixtures of the CLI tests.
cli, fake, workspace = base.cli, base.fake, base.workspace

STEP_FIELDS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens", "cost_usd")
RUN_FIELDS = ("tokens_used", "cost_usd", "active_seconds", "usage_missing")
PRICE = Pricing(input_per_mtok=3.0, output_per_mtok=15.0)


def priced_reply(r: ModelRequest) -> ModelReply:
    usage = Usage(1000 + r.step_idx, 100 + r.step_idx, cached_tokens=r.step_idx, reasoning_tokens=7)
    return ModelReply(tool_calls=(ToolCall("tick", {}),), usage=usage)


async def detached_priced_run(path: Path) -> None:
    """A priced run that ticks three steps and is detached: nobody advances it."""
    gate = Gate(enough=3)
    async with SQLiteJournal(path) as journal:
        model = FunctionModel(priced_reply, pricing=PRICE)
        loop = Loop(model, tools=gate.tools(), journal=journal, limits=LONG)
        task = asyncio.ensure_future(loop.run("priced ticks", run_id="priced"))
        await gate.ticked.wait()
        loop.detach("priced")
        with pytest.raises(RunDetached):
            await task


def recorded(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[int, dict[str, Any]]]]:
    """The journal's own numbers: the runs' totals, and the attempts' usage per step."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        runs = {
            r["run_id"]: dict(r)
            for r in conn.execute(f"SELECT run_id, {', '.join(RUN_FIELDS)} FROM runs")
        }
        steps: dict[str, dict[int, dict[str, Any]]] = {}
        sums = ", ".join(f"sum({f}) AS {f}" for f in STEP_FIELDS)
        query = f"SELECT run_id, step_idx, {sums} FROM model_calls GROUP BY run_id, step_idx"
        for r in conn.execute(query):
            steps.setdefault(r["run_id"], {})[r["step_idx"]] = {f: r[f] for f in STEP_FIELDS}
    finally:
        conn.close()
    return runs, steps


def cell(value: Any, fmt: str = "") -> str:
    return "" if value is None else format(value, fmt)


def table_after(out: str, header: str) -> list[list[str]]:
    """The tab-separated rows under ``header`` up to the first line that is not one (or is
    the next table's header)."""
    lines = out.split(header + "\n", 1)[1].splitlines()
    width = header.count("\t") + 1
    rows = []
    for line in lines:
        cells = line.split("\t")
        if len(cells) != width or cells[0] == "step":
            break
        rows.append(cells)
    return rows


@pytest.fixture
def journal_with_usage(cli: CLI, fake: SlowableServer, workspace: Path) -> tuple[str, Path]:
    first = completion(
        tool_calls=[tool_call("read_file", json.dumps({"path": "notes.txt"}), id="call_1")],
        usage=(120, 30),
        cached_tokens=20,
        reasoning_tokens=5,
    )
    fake.script(first, completion("The note is read.", usage=(200, 40), reasoning_tokens=11))
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    run_id = run_id_of(done.out)
    path = cli.cwd / "j.db"
    asyncio.run(detached_priced_run(path))
    stopped = cli("stop", "priced", "--reason", "enough ticks", "--journal", "j.db")
    assert stopped.code == 0, stopped
    return run_id, path


def test_every_reader_shows_what_the_journal_recorded(
    cli: CLI, journal_with_usage: tuple[str, Path], tmp_path: Path
) -> None:
    run_id, path = journal_with_usage
    runs, steps = recorded(path)
    # The stopped run's totals are its attempts' (NULL before: nobody wrote them).
    priced = runs["priced"]
    priced_steps = steps["priced"]
    assert priced["tokens_used"] == sum(
        s["input_tokens"] + s["output_tokens"] for s in priced_steps.values()
    )
    assert priced["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in priced_steps.values()))
    assert priced["cost_usd"] > 0 and priced["active_seconds"] is not None
    assert steps[run_id][0]["cached_tokens"] == 20 and steps[run_id][1]["reasoning_tokens"] == 11

    j = ("--journal", "j.db")
    table, as_json, listed, stats, export = cli.many(
        ("show", run_id, *j),
        ("show", "priced", *j, "--json"),
        ("runs", *j),
        ("stats", *j),
        ("export", *j, "--format", "jsonl"),
    )
    for d in (table, as_json, listed, stats, export):
        assert d.code == 0, d

    # show (table): the run's totals, then a row per step
    r = runs[run_id]
    assert f"usage: tokens {r['tokens_used']} (input 320, output 70, cached 20, reasoning 16)" in (
        table.out
    ), table
    header = "step\tinput tokens\toutput tokens\tcached\treasoning\tcost ($)"
    rows = table_after(table.out, header)
    assert [row[0] for row in rows] == ["0", "1"], table
    for row in rows:
        u = steps[run_id][int(row[0])]
        assert row[1:] == [
            cell(u["input_tokens"]),
            cell(u["output_tokens"]),
            cell(u["cached_tokens"]),
            cell(u["reasoning_tokens"]),
            cell(u["cost_usd"], ".6f"),
        ], table

    # show --json: the run row's totals, a usage row per step
    data = json.loads(as_json.out)
    for key in RUN_FIELDS:
        assert data["run"][key] == pytest.approx(priced[key]), key
    assert data["run"]["stop_reason"] == "stopped"
    assert data["usage"] == [{"step_idx": i, **u} for i, u in sorted(priced_steps.items())]

    # runs: tokens, cost, active seconds per run
    listed_rows = runs_rows(listed.out)
    for rid, row in listed_rows.items():
        assert row["tokens"] == cell(runs[rid]["tokens_used"]), listed
        assert row["cost ($)"] == cell(runs[rid]["cost_usd"], ".6f"), listed
        assert row["active (s)"] == cell(runs[rid]["active_seconds"], ".2f"), listed

    # stats: per stop reason, the runs' totals (one run each: every percentile is its value)
    spent = table_after(stats.out, "stop_reason\tmeasure\truns\tp50\tp90\tp99\tmax\ttotal")
    by = {(row[0], row[1]): row[2:] for row in spent}
    for rid, reason in ((run_id, "agent_finished"), ("priced", "stopped")):
        for key, fmt in (("tokens_used", ".0f"), ("cost_usd", ".6f"), ("active_seconds", ".2f")):
            value = format(runs[rid][key], fmt)
            assert by[(reason, key)] == ["1", value, value, value, value, value], stats

    # export: the same fields in jsonl and parquet, the step's usage and the run's totals
    jsonl = [json.loads(line) for line in export.out.splitlines()]
    out = tmp_path / "steps.parquet"
    done = cli("export", *j, "--format", "parquet", "-o", str(out))
    assert done.code == 0, done
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = pq.read_table(out).to_pylist()
    assert [set(x) for x in parquet] == [set(x) for x in jsonl]
    for rows_ in (jsonl, parquet):
        assert len(rows_) == 2 + 3
        for x in rows_:
            u = steps[x["run_id"]][x["step_idx"]]
            for f in STEP_FIELDS:
                assert x[f] == pytest.approx(u[f]), (f, x)
            t = runs[x["run_id"]]
            assert x["tokens_used"] == t["tokens_used"]
            assert x["run_cost_usd"] == pytest.approx(t["cost_usd"])
            assert x["active_seconds"] == pytest.approx(t["active_seconds"])
            assert x["usage_missing"] == t["usage_missing"]


def data_attr(html: str, css: str, attr: str) -> str:
    m = re.search(rf'class="[^"]*\b{css}\b[^"]*"[^>]*\bdata-{attr}="([^"]*)"', html)
    assert m, (css, attr)
    return m.group(1)


def check_run_page(html: str, run: dict[str, Any], steps: dict[int, dict[str, Any]]) -> None:
    assert data_attr(html, "tokens-used", "tokens-used") == str(run["tokens_used"])
    assert data_attr(html, "cost-usd", "cost-usd") == cell(run["cost_usd"])
    assert data_attr(html, "active-seconds", "active-seconds") == cell(run["active_seconds"])
    chips = re.findall(r'<span class="usage"([^>]*)>', html)
    assert len(chips) == len(steps)
    for attrs, (_, u) in zip(chips, sorted(steps.items()), strict=True):
        for f in STEP_FIELDS:
            assert f'data-{f.replace("_", "-")}="{cell(u[f])}"' in attrs, (f, attrs)


def test_report_and_view_show_what_the_journal_recorded(
    cli: CLI, journal_with_usage: tuple[str, Path]
) -> None:
    run_id, path = journal_with_usage
    runs, steps = recorded(path)
    for rid in (run_id, "priced"):
        done = cli("report", rid, "--journal", "j.db", "-o", f"{rid}.html")
        assert done.code == 0, done
        check_run_page((cli.cwd / f"{rid}.html").read_text(), runs[rid], steps[rid])

    with serving(path, cli.env) as get:
        listing = get("")
        for rid, run in runs.items():
            row = re.search(rf'<tr data-run="{rid}".*?</tr>', listing, re.DOTALL)
            assert row, rid
            assert data_attr(row.group(0), "tokens-used", "tokens-used") == str(run["tokens_used"])
            assert data_attr(row.group(0), "cost-usd", "cost-usd") == cell(run["cost_usd"])
        api = {r["run_id"]: r for r in json.loads(get("api/runs"))["runs"]}
        for rid, run in runs.items():
            for key in RUN_FIELDS:
                assert api[rid][key] == pytest.approx(run[key]), (rid, key)
        for rid in (run_id, "priced"):
            check_run_page(get(f"runs/{rid}"), runs[rid], steps[rid])
