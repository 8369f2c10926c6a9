"""The pages: run page (also the shared report), full texts, errors (the runs list and the
stats page: :mod:`._runs_pages`).

Every piece of run content goes through a :class:`Disclosure`: the local viewer shows it all
(the owner's data), a shared report shows lengths and hashes unless content is opted in, and
then scrubbed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from polyloop.observe.redact import ScrubFn, summarize

from . import _usage
from ._data import RunDetail, RunRow, StepView
from ._filters import meta_text
from ._html import (
    badge,
    chars,
    esc,
    ms,
    nav_links,
    page,
    pager_links,
    q,
    request_text,
    run_duration,
    short,
    when,
)

STEPS_PER_PAGE = 100
MAX_STEPS_PER_PAGE = 1000


@dataclass(frozen=True, slots=True)
class Disclosure:
    """How much run content a page shows."""

    content: bool = True
    """Show content; False: only its length and hash."""
    scrub: ScrubFn | None = None
    """Run over every piece of content shown."""
    max_chars: int = 20_000
    """Longer content is cut to this, with an expand link (``links``) or a note."""
    links: bool = True
    """Served by the viewer: expand links reach the full text."""
    shared: bool = False
    """A report meant to be shared (says so at the top)."""

    def show(self, text: str) -> str:
        return self.scrub(text) if self.scrub is not None else text


FULL = Disclosure()


def _redacted(label: str, text: str) -> str:
    s = summarize(text)
    return (
        f'<div class="redacted" data-chars="{s.chars}"><span class="label">{esc(label)}</span> '
        f"withheld: {s.chars} chars, <code>{esc(s.sha256)}</code></div>"
    )


def _capped(text: str, d: Disclosure, limit: int, expand: str | None) -> str:
    """``text`` escaped, cut at ``limit`` with a link to the rest (or a note)."""
    if len(text) <= limit:
        return esc(text)
    rest = len(text) - limit
    if expand is not None and d.links:
        more = (
            f'<a class="expand" href="{esc(expand)}" target="_blank" rel="noopener">'
            f"… show all ({chars(len(text))}, {chars(rest)} more)</a>"
        )
    else:
        more = f'<span class="omitted">… {chars(rest)} more not included here</span>'
    return f"{esc(text[:limit])}{more}"


def _block(
    label: str,
    text: str | None,
    d: Disclosure,
    *,
    css: str,
    open_: bool = True,
    expand: str | None = None,
    note: str = "",
) -> str:
    if text is None:
        return ""
    if not d.content:
        return f'<div class="block {css}">{_redacted(label, text)}</div>'
    shown = d.show(text)
    summary = f"{esc(label)} <span class=dim>({chars(len(text))}){note}</span>"
    return (
        f'<details class="block {css}"{" open" if open_ else ""}><summary>{summary}</summary>'
        f"<pre>{_capped(shown, d, d.max_chars, expand)}</pre></details>"
    )


# -- run page ---------------------------------------------------------------------------------

_KIND_LABEL = {
    "executed": "executed",
    "not_executed": "not executed",
    "env_error": "env error",
    "invalid": "parse error",
    "model_failure": "model failure",
    "answer": "final answer",
}


def _mini_bar(value: float, top: float, cls: str, title: str) -> str:
    w = 0.0 if top <= 0 else max(60 * value / top, 1.0 if value > 0 else 0.0)
    return (
        f'<svg class="mini {cls}" width="60" height="8" role="img" aria-label="{esc(title)}">'
        f'<title>{esc(title)}</title><rect class="track" width="60" height="8" rx="2"></rect>'
        f'<rect class="fill" width="{w:.1f}" height="8" rx="2"></rect></svg>'
    )


STRIP_MARKS = 400
"""At most this many marks in a run's overview strip: longer runs share a mark between
neighbouring steps (coloured by the most severe of them)."""
_SEVERITY = ("executed", "answer", "not_executed", "invalid", "env_error", "model_failure")


def _strip(steps: Sequence[StepView], per_page: int, href: Callable[[int], str]) -> str:
    """The run at a glance: marks coloured by what happened, each linking to its step."""
    n = len(steps)
    if n == 0:
        return ""
    size = math.ceil(n / STRIP_MARKS)
    marks = math.ceil(n / size)
    w = 1000 / marks
    parts = [
        f'<svg class="strip" viewBox="0 0 1000 18" preserveAspectRatio="none" role="img" '
        f'aria-label="{n} steps">'
    ]
    for m in range(marks):
        group = steps[m * size : (m + 1) * size]
        kinds = [v.kind for v in group]
        kind = max(kinds, key=lambda k: _SEVERITY.index(k) if k in _SEVERITY else 0)
        first = group[0].step
        target = href(m * size // per_page + 1) + f"#step-{first.step_idx}"
        if len(group) == 1:
            tip = f"step {first.step_idx}: {_KIND_LABEL.get(kind, kind)}"
            if first.tool_name:
                tip += f" {first.tool_name}"
        else:
            counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
            tip = f"steps {first.step_idx}–{group[-1].step.step_idx}: " + ", ".join(
                f"{c} {_KIND_LABEL.get(k, k)}" for k, c in counts.items()
            )
        parts.append(
            f'<a href="{esc(target)}"><rect class="k-{kind}" x="{m * w:.2f}" y="0" '
            f'width="{max(w - (0.3 if w > 2 else 0), 0.5):.2f}" height="18">'
            f"<title>{esc(tip)}</title></rect></a>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _step_html(v: StepView, run_id: str, d: Disclosure, top_ms: float, top_prompt: int) -> str:
    s = v.step
    kind = v.kind
    base = f"/runs/{q(run_id)}/steps/{s.step_idx}"
    if s.action is not None:
        headline = (
            f'<code class="action">{esc(short(d.show(s.action), 90))}</code>'
            if d.content
            else f'<code class="action">{esc(s.tool_name or "action")}(…)</code>'
        )
    elif kind == "answer":
        headline = '<span class="answer-label">final answer</span>'
    elif kind == "model_failure":
        headline = '<span class="failure-label">the model call failed</span>'
    elif s.parse_error is not None and d.content:
        headline = f'<span class="perr">{esc(short(d.show(s.parse_error), 90))}</span>'
    else:
        headline = '<span class="perr">the reply could not be read as a decision</span>'
    flags = ""
    if v.hidden_tail:
        flags += f'<span class="flag cut">{v.hidden_tail} unseen</span>'
    if s.completed:
        flags += '<span class="flag done">completed</span>'
    if v.failed_attempts:
        flags += f'<span class="flag retry">{len(v.failed_attempts)} failed attempt(s)</span>'
    bars = (
        '<span class="bars">'
        f"{_mini_bar(s.step_wall_ms, top_ms, 'wall', f'step_wall_ms {s.step_wall_ms:.0f}')}"
        f'<span class="num">{esc(ms(s.step_wall_ms))}</span>'
        f"{_mini_bar(s.prompt_chars, top_prompt, 'prompt', f'prompt_chars {s.prompt_chars}')}"
        f'<span class="num">{esc(chars(s.prompt_chars))}</span>{_usage.step_chip(v.usage)}</span>'
    )
    summary = (
        f'<summary><span class="idx">#{s.step_idx}</span>'
        f'<span class="status st-{kind}">{esc(_KIND_LABEL.get(kind, kind))}</span>'
        f"{headline}{flags}{bars}</summary>"
    )
    body: list[str] = []
    if s.parse_error is not None:
        if d.content:
            body.append(
                f'<div class="parse-error"><strong>Parse error</strong> (the feedback sent to '
                f"the model)<pre>{_capped(d.show(s.parse_error), d, d.max_chars, None)}</pre></div>"
            )
        else:
            body.append(f'<div class="parse-error">{_redacted("parse error", s.parse_error)}</div>')
    for failure in v.failed_attempts:
        kind_text = failure.partition(":")[0]
        text = d.show(failure) if d.content else f"{kind_text}: (message withheld)"
        body.append(f'<div class="attempt-failed">Model call failed: {esc(short(text, 400))}</div>')
    text = v.text if v.text is not None else s.raw_response
    if s.llm_call_id is not None and not text:
        body.append('<div class="dim model-text empty">The reply had no visible text.</div>')
    elif s.llm_call_id is not None:
        body.append(
            _block(
                "Model text",
                text,
                d,
                css="model-text",
                expand=f"{base}/text" if v.text is not None else f"{base}/raw_response",
            )
        )
        if v.reasoning:
            body.append(
                _block(
                    "Reasoning",
                    v.reasoning,
                    d,
                    css="reasoning",
                    open_=False,
                    expand=f"{base}/reasoning",
                )
            )
        elif s.reasoning_chars:
            body.append(
                f'<div class="dim">Reasoning: {s.reasoning_chars} chars (not recorded)</div>'
            )
    if s.action is not None:
        if d.content:
            tool = (
                f'<span class="dim">tool</span> <code class="tool">{esc(s.tool_name)}</code>'
                if s.tool_name
                else ""
            )
            body.append(
                f'<div class="block action-detail"><div class="label">Action {tool}</div>'
                f"{_arguments(s.tool_args_json, s.action, d, f'{base}/action')}</div>"
            )
        else:
            tool = f' tool <code class="tool">{esc(s.tool_name)}</code>' if s.tool_name else ""
            what = s.tool_args_json if s.tool_args_json is not None else s.action
            body.append(
                f'<div class="block action-detail">Action{tool}{_redacted("arguments", what)}</div>'
            )
    if s.observation is not None:
        body.append(_observation(v, d, f"{base}/observation"))
    info = [f"status {esc(s.action_status or kind)}"]
    if v.action_latency_ms is not None:
        info.append(f"action {esc(ms(v.action_latency_ms))}")
    info.append(f"step {esc(ms(s.step_wall_ms))}")
    info.append(f"prompt {s.prompt_chars} chars")
    info.append(f"reply {s.response_chars} chars")
    if s.reasoning_chars:
        info.append(f"reasoning {s.reasoning_chars} chars")
    if s.llm_call_id:
        info.append(f"call <code>{esc(s.llm_call_id)}</code>")
    body.append(f'<div class="step-info dim">{" · ".join(info)}</div>')
    return (
        f'<details class="step k-{kind}" id="step-{s.step_idx}" data-step="{s.step_idx}" '
        f'data-kind="{kind}">{summary}<div class="step-body">{"".join(body)}</div></details>'
    )


def _arguments(args_json: str | None, action: str, d: Disclosure, expand: str) -> str:
    """A tool call's arguments, one per row; a string is shown as its text (code reads as
    code, not as a JSON string full of escapes). Other actions: the action's text."""
    try:
        args = json.loads(args_json) if args_json is not None else None
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return f"<pre>{_capped(d.show(args_json or action), d, d.max_chars, expand)}</pre>"
    if not args:
        return '<div class="dim">no arguments</div>'
    rows = []
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
        rows.append(
            f'<div class="arg"><code class="arg-name">{esc(key)}</code>'
            f"<pre>{_capped(d.show(text), d, d.max_chars, expand)}</pre></div>"
        )
    return "".join(rows)


def _observation(v: StepView, d: Disclosure, expand: str) -> str:
    s = v.step
    obs = s.observation or ""
    hidden = v.hidden_tail
    label = "Observation" + (" (synthetic: written by PolyLoop)" if s.observation_synthetic else "")
    notes = []
    if hidden:
        notes.append(f"{hidden} at the end not seen by the model")
    if v.tool_cut:
        notes.append(f"the tool itself left out {v.tool_cut} chars")
    note = f' <span class="dim">· {esc("; ".join(notes))}</span>' if notes else ""
    if not d.content:
        extra = f'<div class="dim">{esc("; ".join(notes))}</div>' if notes else ""
        return f'<div class="block observation">{_redacted(label, obs)}{extra}</div>'
    seen, unseen = obs[: len(obs) - hidden], obs[len(obs) - hidden :]
    pre = _capped(d.show(seen), d, d.max_chars, expand)
    if unseen:
        pre += (
            f'<span class="unseen" title="the model did not see this part">'
            f'<span class="unseen-label">▼ the model did not see the {hidden} chars below '
            "(max_observation_chars)</span>"
            f"{_capped(d.show(unseen), d, d.max_chars // 4, expand)}</span>"
        )
    return (
        f'<details class="block observation" open><summary>{esc(label)} '
        f'<span class="dim">({chars(len(obs))})</span>{note}</summary><pre>{pre}</pre></details>'
    )


def _ending(detail: RunDetail, d: Disclosure) -> str:
    run = detail.run
    parts: list[str] = []
    if run.status != "ended":
        state = {
            "live": "in progress",
            "detached": "not ended, nobody is advancing it (detached or interrupted: resumable)",
            "stale": "not ended, its owner is gone (lease expired or process dead: resumable)",
            "awaiting_approval": (
                "parked until a person approves or denies its action (polyloop pending lists "
                "it; polyloop approve / deny decide; read-only here)"
            ),
        }.get(run.state, "not ended")
        parts.append(f"<p>Run {badge(None, state=run.state)} — {esc(state)}.</p>")
        if run.request is not None:
            parts.append(
                f'<p class="request">Pending: {esc(request_text(run, content=d.content))} '
                "(the execution advancing the run ends it at its next heartbeat; a run nobody "
                "advances is ended by the next resume or request).</p>"
            )
        if detail.in_flight:
            parts.append(f'<p class="in-flight">In flight: {esc(detail.in_flight)}</p>')
        return (
            '<section class="ending running" id="ending"><h2>Not ended</h2>'
            f"{''.join(parts)}</section>"
        )
    parts.append(
        f'<p class="stopped">Stopped: {badge(run.stop_reason)} after {run.steps_used} steps, '
        f"{run.actions_executed} actions.</p>"
    )
    if run.request is not None:
        text = request_text(run, content=d.content)
        parts.append(f'<p class="request dim">Request: {esc(text)}.</p>')
    if run.stop_detail:
        if d.content:
            parts.append(
                f'<div class="stop-detail"><div class="label">Detail</div>'
                f"<pre>{_capped(d.show(run.stop_detail), d, d.max_chars, None)}</pre></div>"
            )
        else:
            parts.append(_redacted("stop detail", run.stop_detail))
    if run.final_answer is not None:
        parts.append(_block("Final answer", run.final_answer, d, css="final-answer"))
    if detail.model_failure and d.content:
        parts.append(
            f'<p class="dim">Model failure: {esc(short(d.show(detail.model_failure), 400))}</p>'
        )
    p = detail.pending
    if p is not None:
        args = (
            f"<pre>{_capped(d.show(p.args_json), d, 4000, None)}</pre>"
            if d.content and p.args_json is not None
            else (_redacted("arguments", p.args_json) if p.args_json is not None else "")
        )
        parts.append(
            '<div class="pending"><div class="label">Action of unknown outcome</div>'
            f"<p>step {p.step_idx}, tool <code>{esc(p.tool_name)}</code>, op_id "
            f"<code>{esc(p.op_id)}</code>, replay policy <code>{esc(p.replay_policy)}</code>. "
            "Check whether it happened before running it again.</p>"
            f"{args}</div>"
        )
    rep = detail.report
    if rep is not None:
        rows = "".join(
            f"<tr><td><code>{esc(e.fingerprint)}</code></td>"
            f"<td>{esc(e.failure.error_type or '')}</td>"
            f"<td>{esc(d.show(e.failure.check or '') if d.content else '')}</td>"
            f"<td>{esc(short(d.show(e.failure.message or ''), 160) if d.content else '')}</td>"
            f"<td class=num>{e.count}</td><td>{esc(', '.join(map(str, e.steps)))}</td></tr>"
            for e in rep.fingerprints
        )
        attempts = ""
        if d.content and rep.attempts:
            attempts = (
                "<ol>"
                + "".join(
                    f"<li><code>{esc(short(d.show(a), 160))}</code></li>" for a in rep.attempts
                )
                + "</ol>"
            )
        parts.append(
            '<div class="escalation"><div class="label">Escalation report</div>'
            f"<p>Pattern <strong>{esc(rep.pattern)}</strong>; "
            f"stopped at step {rep.stopped_at_step} "
            f"(one failure seen {rep.limit} times).</p>"
            "<table><thead><tr><th>fingerprint</th><th>error</th><th>check</th><th>message</th>"
            f"<th>count</th><th>steps</th></tr></thead><tbody>{rows}</tbody></table>"
            f"{attempts}"
            f"<p>{esc(d.show(rep.question)) if d.content else ''}</p></div>"
        )
    return f'<section class="ending" id="ending"><h2>End</h2>{"".join(parts)}</section>'


def run_page(
    detail: RunDetail,
    *,
    page_no: int = 1,
    per_page: int = STEPS_PER_PAGE,
    disclosure: Disclosure = FULL,
    now: float,
    standalone: bool = False,
    footer: str = "",
) -> str:
    """The run page (``standalone``: every step on one page, assets inline: the report)."""
    run = detail.run
    d = disclosure
    steps = detail.steps
    n = len(steps)
    if standalone:
        per_page, page_no = max(n, 1), 1
    pages = max(1, math.ceil(n / per_page))
    page_no = min(max(page_no, 1), pages)
    shown = steps[(page_no - 1) * per_page : page_no * per_page]
    top_ms = max((v.step.step_wall_ms for v in steps), default=0.0)
    top_prompt = max((v.step.prompt_chars for v in steps), default=0)
    per = "" if per_page == STEPS_PER_PAGE else f"&per={per_page}"

    def link(p: int) -> str:
        return "" if standalone else f"/runs/{q(run.run_id)}?page={p}{per}"

    strip = _strip(steps, per_page, link)
    meta = ""
    if run.metadata:
        if d.content:
            meta = "".join(
                f"<div><code>{esc(k)}</code> = {esc(short(d.show(meta_text(v)), 200))}</div>"
                for k, v in run.metadata.items()
            )
        else:
            meta = "".join(
                f"<div><code>{esc(k)}</code> {_redacted('value', meta_text(v))}</div>"
                for k, v in run.metadata.items()
            )
    limits = ", ".join(f"{k}={v}" for k, v in run.limits.items() if v is not None)
    notice = ""
    if d.shared:
        notice = (
            '<p class="notice">'
            + (
                "Shared report with content, scrubbed of keys, tokens and emails by pattern."
                if d.content
                else "Shared report: content is withheld — only lengths, sha256 hashes, tool "
                "names, statuses, ids and timings are included."
            )
            + "</p>"
        )
    head = (
        f'<h1>Run <code class="run-id">{esc(run.run_id)}</code> '
        f"{badge(run.stop_reason, state=run.state)}</h1>"
        f"{notice}"
        '<div class="run-head">'
        f'<div class="goal-wrap">{_block("Goal", run.goal, d, css="goal")}</div>'
        '<dl class="facts">'
        f"<dt>Created</dt><dd>{esc(when(run.created_at))}</dd>"
        f"<dt>Ended</dt><dd>{esc(when(run.ended_at) or '—')}</dd>"
        f"<dt>Duration</dt><dd>{esc(run_duration(run, now))}</dd>"
        f'<dt>Steps</dt><dd class="steps-used">{run.steps_used}</dd>'
        f"<dt>Actions</dt><dd>{run.actions_executed}</dd>"
        f"{_usage.run_facts(run.usage)}"
        f"<dt>Limits</dt><dd>{esc(limits)}</dd>"
        + (f'<dt>Metadata</dt><dd class="metadata">{meta}</dd>' if meta else "")
        + "</dl></div>"
    )
    legend = (
        '<div class="legend">'
        + "".join(
            f'<span class="k-{k}"><i></i>{esc(label)}</span>' for k, label in _KIND_LABEL.items()
        )
        + "</div>"
    )
    tools = (
        '<div class="tools"><button type="button" data-expand="all">Expand all</button>'
        '<button type="button" data-expand="none">Collapse all</button></div>'
    )
    pager = "" if standalone else pager_links(page_no, pages, link)
    first = (page_no - 1) * per_page
    range_text = f"Steps {first}–{first + len(shown) - 1} of {n}" if shown else "No steps yet"
    timeline = "".join(_step_html(v, run.run_id, d, top_ms, top_prompt) for v in shown)
    ending = (
        _ending(detail, d)
        if page_no == pages
        else (
            f'<p class="dim">The end of the run is on <a href="{esc(link(pages))}#ending">'
            "the last page</a>.</p>"
        )
    )
    body = (
        f"{head}{strip}{legend}"
        '<div class="timeline-head"><h2>Timeline</h2>'
        f'<span class="range">{esc(range_text)}</span>{tools}</div>'
        f'{pager}<div class="timeline">{timeline}</div>{pager}{ending}{footer}'
    )
    attrs = ""
    if not standalone and run.status != "ended":
        attrs = (
            f' data-poll-run="/api/runs/{q(run.run_id)}" data-token="{esc(token_text(run))}"'
            f' data-last-page="{1 if page_no == pages else 0}"'
        )
    return page(
        f"Run {run.run_id}",
        body,
        nav="" if standalone else nav_links("run"),
        inline_assets=standalone,
        body_attrs=attrs,
    )


def token_text(run: RunRow) -> str:
    return "|".join(str(x) for x in run.token())


def full_text_page(run_id: str, step_idx: int, field: str, text: str, hidden_tail: int = 0) -> str:
    """One field of one step in full (the viewer's expand link)."""
    seen, unseen = text[: len(text) - hidden_tail], text[len(text) - hidden_tail :]
    pre = esc(seen)
    if unseen:
        pre += (
            f'<span class="unseen"><span class="unseen-label">▼ the model did not see the '
            f"{hidden_tail} chars below</span>{esc(unseen)}</span>"
        )
    body = (
        f'<h1>Run <a href="/runs/{q(run_id)}#step-{step_idx}"><code>{esc(run_id)}</code></a>, '
        f"step {step_idx}: {esc(field)}</h1><p class=dim>{chars(len(text))}</p>"
        f'<pre class="full">{pre}</pre>'
    )
    return page(f"{field} of step {step_idx}", body, nav=nav_links("run"))


def error_page(status: str, message: str) -> str:
    body = (
        f'<h1>{esc(status)}</h1><p class="error-line">{esc(message)}</p>'
        '<p><a href="/">All runs</a></p>'
    )
    return page(status, body, nav=nav_links(""))
