"""``OTelObserver``: a run's events as OpenTelemetry spans (GenAI semantic conventions).

Extra ``polyloop[otel]``. The OpenTelemetry API is imported lazily: this module imports without
it, and constructing an :class:`OTelObserver` without it raises a one-line ``ImportError``
naming the extra. Only ``opentelemetry-api`` is needed to make spans; configure an SDK
``TracerProvider`` (extra: ``opentelemetry-sdk``) with the exporter of your tracing stack.

Spans (all ended, whatever way the run ends; ``RunEnded`` arrives for ``cancelled`` too):

============================  ===========================================================
``invoke_agent [agent]``      one per run (per ``run``/``resume`` call), a child of the span
                              active where the run started. ``gen_ai.operation.name``
                              ``invoke_agent``; ``polyloop.stop_reason``,
                              ``polyloop.steps_used``, ``polyloop.actions_executed``;
                              status ERROR for the error stops.
``chat [model]``              one per model-call attempt (a retry is a new span), child of
                              the run span. ``gen_ai.operation.name`` ``chat``,
                              ``gen_ai.request.model`` when known, ``gen_ai.response.id``,
                              ``gen_ai.usage.input_tokens``/``output_tokens`` when known.
``execute_tool [tool]``       one per action, child of the run span.
                              ``gen_ai.operation.name`` ``execute_tool``,
                              ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (the action's
                              ``op_id``, its idempotency key), ``polyloop.action_status``.
============================  ===========================================================

What the events do not carry can be added: :meth:`OTelObserver.instrument` wraps the model so
that token usage, the provider's response id and the model name reach the ``chat`` spans, and
:meth:`OTelObserver.set_run_metadata` names the model (and agent) of a run from its metadata.

Redaction (``polyloop.observe.redact``): by default spans carry only safe data: ids,
statuses, tool names, counters, timings, and for each piece of content its length
(``*.chars``) and hash (``*.sha256``). With ``include_content=True`` the content is added too
(``gen_ai.input.messages`` with the goal, ``gen_ai.output.messages``,
``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``, ``polyloop.parse_error``,
``polyloop.stop_detail``, ``polyloop.error.message``), each scrubbed and capped at
``max_content_chars``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from polyloop import ModelReply, ModelRequest, StepRecord
from polyloop.events import (
    ActionFinished,
    ActionStarted,
    Event,
    ModelCallFinished,
    ModelCallStarted,
    RunEnded,
    RunStarted,
    StepAppended,
)
from polyloop.types import import_extra, usage_refusal

from .redact import DEFAULT_SCRUBBER, ScrubFn, digest

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from polyloop.seams import Model

__all__ = ["ERROR_STOPS", "OTelObserver"]

_INSTALL_HINT: Final = "OTelObserver needs OpenTelemetry: pip install 'polyloop[otel]'"

ERROR_STOPS: Final = frozenset(
    {
        "llm_error",
        "env_error",
        "parse_failed_repeatedly",
        "resume_state_unknown",
        "repeated_failure",
        "escalated",
    }
)
"""Stop reasons that set the run span's status to ERROR (the others leave it unset)."""

_TRACER_NAME: Final = "polyloop"


def _trace() -> ModuleType:
    """``opentelemetry.trace``, imported on first use (layout.md rule 6)."""
    # opentelemetry is a namespace package: without the API, "opentelemetry" itself or only
    # its "trace" module is missing.
    return import_extra("opentelemetry.trace", _INSTALL_HINT, missing=("opentelemetry",))


@dataclass(slots=True)
class _Open:
    """A span whose end is known (``end_ns``) but waits for its step's record."""

    span: Span
    end_ns: int | None = None


@dataclass(slots=True)
class _Run:
    span: Span
    ctx: Context
    model: str | None
    provider: str | None
    calls: dict[tuple[int, int], _Open] = field(default_factory=dict)
    tools: dict[int, _Open] = field(default_factory=dict)
    input_tokens: int | None = None
    output_tokens: int | None = None


class OTelObserver:
    """An observer (``Loop(..., observers=[OTelObserver()])``) exporting runs as spans.

    Args:
        tracer_provider: where spans go; default: the global provider
            (``opentelemetry.trace.set_tracer_provider``).
        include_content: also export content (goal, model output, tool arguments and results,
            parse errors, stop details), scrubbed. Default False: lengths and hashes only.
        scrubber: run over every piece of exported content (default
            :data:`~polyloop.observe.redact.DEFAULT_SCRUBBER`; any ``str -> str`` callable;
            ``None`` exports content unscrubbed). Unused unless ``include_content``.
        request_model: the model name for ``gen_ai.request.model`` when neither the run's
            metadata nor an instrumented model names it.
        provider_name: ``gen_ai.provider.name`` (``openai``, ``anthropic``, ...), when known.
        agent_name: ``gen_ai.agent.name`` on run spans (and in their name).
        max_content_chars: content longer than this is cut, with the count of what was cut.

    Thread-safe; one observer can serve many concurrent runs. Like every observer it never
    blocks: the spans go to the provider's span processors (use a batching one in production).

    Raises:
        ImportError: the OpenTelemetry API is not installed (one line naming the extra).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        include_content: bool = False,
        scrubber: ScrubFn | None = DEFAULT_SCRUBBER,
        *,
        request_model: str | None = None,
        provider_name: str | None = None,
        agent_name: str | None = None,
        max_content_chars: int = 8192,
    ) -> None:
        trace = _trace()
        from polyloop import __version__

        self._trace = trace
        self._tracer: Tracer = trace.get_tracer(
            _TRACER_NAME, __version__, tracer_provider=tracer_provider
        )
        self.include_content = include_content
        self._scrub = scrubber
        self._request_model = request_model
        self._provider = provider_name
        self._agent = agent_name
        self._max = max(int(max_content_chars), 0)
        self._lock = threading.RLock()
        self._runs: dict[str, _Run] = {}
        self._meta: dict[str, tuple[str | None, str | None]] = {}

    # -- configuration ------------------------------------------------------------------------
    def set_run_metadata(self, run_id: str, metadata: Mapping[str, Any] | None) -> None:
        """Take the model (and provider) of run ``run_id`` from its metadata, the mapping
        passed to ``Loop.run(metadata=...)``: keys ``gen_ai.request.model`` or ``model``, and
        ``gen_ai.provider.name`` or ``provider``; or the ``polyloop`` command's ``cli.model``
        (``provider:name``). Call it before the run starts (or resumes)."""
        meta = dict(metadata or {})
        model = meta.get("gen_ai.request.model") or meta.get("model")
        provider = meta.get("gen_ai.provider.name") or meta.get("provider")
        cli = meta.get("cli")
        if model is None and isinstance(cli, Mapping) and isinstance(cli.get("model"), str):
            head, sep, tail = cli["model"].partition(":")
            model, provider = (tail, provider or head) if sep else (head, provider)
        with self._lock:
            self._meta[run_id] = (
                str(model) if model is not None else None,
                str(provider) if provider is not None else None,
            )

    def instrument(self, model: Model) -> Model:
        """``model``, wrapped so that each call's token usage, the provider's response id and
        the model's name (its ``model`` attribute, when a string) reach its ``chat`` span.
        Attributes not defined by the wrapper are the wrapped model's."""
        return _InstrumentedModel(model, self)

    # -- the observer -------------------------------------------------------------------------
    def __call__(self, event: Event) -> None:
        with self._lock:
            if isinstance(event, RunStarted):
                self._run_started(event)
            elif isinstance(event, ModelCallStarted):
                self._call_started(event)
            elif isinstance(event, ModelCallFinished):
                self._call_finished(event)
            elif isinstance(event, ActionStarted):
                self._action_started(event)
            elif isinstance(event, ActionFinished):
                self._action_finished(event)
            elif isinstance(event, StepAppended):
                self._step_appended(event)
            elif isinstance(event, RunEnded):
                self._run_ended(event)

    def close(self) -> None:
        """End every span still open (runs that were detached or interrupted without a
        ``RunEnded``), marking them ``polyloop.interrupted``. Idempotent."""
        with self._lock:
            for run_id in list(self._runs):
                self._abandon(run_id, "the observer was closed before the run ended")

    @property
    def open_runs(self) -> tuple[str, ...]:
        """Runs whose span is still open."""
        with self._lock:
            return tuple(self._runs)

    # -- run ----------------------------------------------------------------------------------
    def _run_started(self, e: RunStarted) -> None:
        if e.run_id in self._runs:  # resumed in this process after a detach
            self._abandon(e.run_id, "the run was resumed: a new run span continues it")
        model, provider = self._meta.get(e.run_id, (None, None))
        model = model or self._request_model
        provider = provider or self._provider
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": e.run_id,
            "polyloop.run_id": e.run_id,
            "polyloop.resumed": e.resumed,
            "polyloop.steps_at_start": e.steps_used,
            **self._content("polyloop.goal", e.goal),
        }
        if self._agent:
            attrs["gen_ai.agent.name"] = self._agent
        if model:
            attrs["gen_ai.request.model"] = model
        if provider:
            attrs["gen_ai.provider.name"] = provider
        if self.include_content:
            attrs["gen_ai.input.messages"] = _messages("user", self._export(e.goal))
        name = f"invoke_agent {self._agent}" if self._agent else "invoke_agent"
        span = self._tracer.start_span(name, kind=self._trace.SpanKind.INTERNAL, attributes=attrs)
        ctx = self._trace.set_span_in_context(span)
        self._runs[e.run_id] = _Run(span, ctx, model, provider)

    def _run_ended(self, e: RunEnded) -> None:
        run = self._runs.pop(e.run_id, None)
        self._meta.pop(e.run_id, None)
        if run is None:
            return
        reason = str(e.stop_reason)
        self._end_pending(run, f"the run ended ({reason}) before this finished")
        span = run.span
        span.set_attribute("polyloop.stop_reason", reason)
        span.set_attribute("polyloop.steps_used", e.steps_used)
        span.set_attribute("polyloop.actions_executed", e.actions_executed)
        if e.stop_detail is not None:
            for k, v in self._content("polyloop.stop_detail", e.stop_detail).items():
                span.set_attribute(k, v)
            if self.include_content:
                span.set_attribute("polyloop.stop_detail", self._export(e.stop_detail))
        if run.input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", run.input_tokens)
        if run.output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", run.output_tokens)
        if reason in ERROR_STOPS:
            span.set_attribute("error.type", reason)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, reason))
        span.end()

    def _abandon(self, run_id: str, why: str) -> None:
        run = self._runs.pop(run_id)
        self._end_pending(run, why)
        run.span.set_attribute("polyloop.interrupted", True)
        run.span.end()

    def _end_pending(self, run: _Run, why: str) -> None:
        """End every child span still open: those whose end is known at that time; those
        still running now, marked interrupted (a cancelled run's call or action)."""
        for pending in (*run.calls.values(), *run.tools.values()):
            if pending.end_ns is None:
                pending.span.set_attribute("polyloop.interrupted", True)
                pending.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, why))
            pending.span.end(end_time=pending.end_ns)
        run.calls.clear()
        run.tools.clear()

    # -- model calls --------------------------------------------------------------------------
    def _call_started(self, e: ModelCallStarted) -> None:
        run = self._runs.get(e.run_id)
        if run is None:
            return
        for key in [k for k in run.calls if k[0] == e.step_idx]:  # an earlier attempt
            done = run.calls.pop(key)
            done.span.end(end_time=done.end_ns)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "polyloop.run_id": e.run_id,
            "polyloop.step_idx": e.step_idx,
            "polyloop.intent_id": e.intent_id,
            "polyloop.attempt": e.attempt,
        }
        if run.model:
            attrs["gen_ai.request.model"] = run.model
        if run.provider:
            attrs["gen_ai.provider.name"] = run.provider
        span = self._tracer.start_span(
            f"chat {run.model}" if run.model else "chat",
            context=run.ctx,
            kind=self._trace.SpanKind.CLIENT,
            attributes=attrs,
        )
        run.calls[(e.step_idx, e.attempt)] = _Open(span)

    def _call_finished(self, e: ModelCallFinished) -> None:
        run = self._runs.get(e.run_id)
        pending = None if run is None else run.calls.get((e.step_idx, e.attempt))
        if run is None or pending is None:
            return
        span = pending.span
        pending.end_ns = time.time_ns()
        span.set_attribute("polyloop.latency_ms", float(e.latency_ms))
        if e.llm_call_id is not None:
            span.set_attribute("gen_ai.response.id", e.llm_call_id)
            span.set_attribute("polyloop.llm_call_id", e.llm_call_id)
        if e.error is None:
            return  # ended with its step, which adds what the reply was
        error_type = e.error.partition(":")[0].strip() or "error"
        span.set_attribute("error.type", error_type)
        for k, v in self._content("polyloop.error.message", e.error).items():
            span.set_attribute(k, v)
        if self.include_content:
            span.set_attribute("polyloop.error.message", self._export(e.error))
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error_type))
        run.calls.pop((e.step_idx, e.attempt))
        span.end(end_time=pending.end_ns)

    def _on_request(self, request: ModelRequest, model_name: str | None) -> None:
        run = self._runs.get(request.run_id)
        pending = None if run is None else run.calls.get((request.step_idx, request.attempt))
        if pending is None or not model_name:
            return
        assert run is not None
        if run.model is None:
            run.model = model_name
            run.span.set_attribute("gen_ai.request.model", model_name)
        pending.span.set_attribute("gen_ai.request.model", model_name)
        pending.span.update_name(f"chat {model_name}")

    def _on_reply(self, request: ModelRequest, reply: ModelReply) -> None:
        run = self._runs.get(request.run_id)
        pending = None if run is None else run.calls.get((request.step_idx, request.attempt))
        if pending is None:
            return
        assert run is not None
        span = pending.span
        if reply.call_id:
            span.set_attribute("gen_ai.response.id", reply.call_id)
        usage = reply.usage
        if usage is not None and usage_refusal(usage) is not None:
            usage = None  # the kernel refuses it too (Usage): nothing to count
        if usage is not None and usage.input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            run.input_tokens = (run.input_tokens or 0) + usage.input_tokens
        if usage is not None and usage.output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            run.output_tokens = (run.output_tokens or 0) + usage.output_tokens
        if reply.tool_calls:
            span.set_attribute("polyloop.tool_calls", len(reply.tool_calls))

    # -- actions ------------------------------------------------------------------------------
    def _action_started(self, e: ActionStarted) -> None:
        run = self._runs.get(e.run_id)
        if run is None:
            return
        run.tools[e.step_idx] = _Open(
            self._tool_span(run, e.run_id, e.step_idx, e.op_id, e.tool_name)
        )
        for k, v in self._content("polyloop.action", e.action).items():
            run.tools[e.step_idx].span.set_attribute(k, v)

    def _tool_span(
        self, run: _Run, run_id: str, step_idx: int, op_id: str, tool_name: str | None
    ) -> Span:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.call.id": op_id,
            "polyloop.run_id": run_id,
            "polyloop.step_idx": step_idx,
            "polyloop.op_id": op_id,
        }
        if tool_name is not None:
            attrs["gen_ai.tool.name"] = tool_name
        return self._tracer.start_span(
            f"execute_tool {tool_name}" if tool_name else "execute_tool",
            context=run.ctx,
            kind=self._trace.SpanKind.INTERNAL,
            attributes=attrs,
        )

    def _action_finished(self, e: ActionFinished) -> None:
        run = self._runs.get(e.run_id)
        if run is None:
            return
        pending = run.tools.get(e.step_idx)
        if pending is None:  # the outcome came from the journal on resume: no execution seen
            span = self._tool_span(run, e.run_id, e.step_idx, e.op_id, e.tool_name)
            span.set_attribute("polyloop.recovered", True)
            pending = run.tools[e.step_idx] = _Open(span)
        pending.end_ns = time.time_ns()
        status = str(e.status)
        pending.span.set_attribute("polyloop.action_status", status)
        pending.span.set_attribute("polyloop.latency_ms", float(e.latency_ms))
        if status == "env_error":
            pending.span.set_attribute("error.type", "env_error")
            pending.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, "env_error"))

    # -- steps --------------------------------------------------------------------------------
    def _step_appended(self, e: StepAppended) -> None:
        run = self._runs.get(e.run_id)
        if run is None:
            return
        step = e.step
        for key in [k for k in run.calls if k[0] == step.step_idx]:
            call = run.calls.pop(key)
            self._describe_reply(call.span, step)
            call.span.end(end_time=call.end_ns)
        tool = run.tools.pop(step.step_idx, None)
        if tool is not None:
            self._describe_outcome(tool.span, step)
            tool.span.end(end_time=tool.end_ns)

    def _describe_reply(self, span: Span, step: StepRecord) -> None:
        span.set_attribute("polyloop.prompt_chars", step.prompt_chars)
        span.set_attribute("polyloop.response_chars", step.response_chars)
        span.set_attribute("polyloop.reasoning_chars", step.reasoning_chars)
        span.set_attribute("polyloop.parse_ok", step.parse_ok)
        for k, v in self._content("polyloop.response", step.raw_response).items():
            span.set_attribute(k, v)
        if step.parse_error is not None:
            for k, v in self._content("polyloop.parse_error", step.parse_error).items():
                span.set_attribute(k, v)
        if self.include_content:
            span.set_attribute(
                "gen_ai.output.messages", _messages("assistant", self._export(step.raw_response))
            )
            if step.parse_error is not None:
                span.set_attribute("polyloop.parse_error", self._export(step.parse_error))

    def _describe_outcome(self, span: Span, step: StepRecord) -> None:
        args = step.tool_args_json if step.tool_args_json is not None else step.action
        if args is not None:
            for k, v in self._content("polyloop.tool.arguments", args).items():
                span.set_attribute(k, v)
        if step.observation is not None:
            for k, v in self._content("polyloop.observation", step.observation).items():
                span.set_attribute(k, v)
        span.set_attribute("polyloop.observation_truncated_chars", step.observation_truncated_chars)
        span.set_attribute("polyloop.observation_synthetic", step.observation_synthetic)
        span.set_attribute("polyloop.completed", step.completed)
        if self.include_content:
            if args is not None:
                span.set_attribute("gen_ai.tool.call.arguments", self._export(args))
            if step.observation is not None:
                span.set_attribute("gen_ai.tool.call.result", self._export(step.observation))

    # -- content ------------------------------------------------------------------------------
    def _content(self, prefix: str, text: str) -> dict[str, Any]:
        """The safe summary of a piece of content: always exported."""
        return {f"{prefix}.chars": len(text), f"{prefix}.sha256": digest(text)}

    def _export(self, text: str) -> str:
        """Content as exported (only with ``include_content``): scrubbed, then capped."""
        if self._scrub is not None:
            text = self._scrub(text)
        if len(text) > self._max:
            text = f"{text[: self._max]}…[+{len(text) - self._max} chars]"
        return text


def _messages(role: str, text: str) -> str:
    """One message in the GenAI conventions' JSON shape for input/output messages."""
    return json.dumps(
        [{"role": role, "parts": [{"type": "text", "content": text}]}], ensure_ascii=False
    )


class _InstrumentedModel:
    """A Model that reports each call's request and reply to its observer's open span."""

    def __init__(self, inner: Model, observer: OTelObserver) -> None:
        self._inner = inner
        self._observer = observer
        name = getattr(inner, "model", None)
        self._name = name if isinstance(name, str) and name else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"instrumented({self._inner!r})"

    async def complete(self, request: ModelRequest) -> ModelReply:
        obs = self._observer
        with obs._lock:
            obs._on_request(request, self._name)
        reply = await self._inner.complete(request)
        if isinstance(reply, ModelReply):
            with obs._lock:
                obs._on_reply(request, reply)
        return reply
