"""``InspectModel``: the Model seam over an Inspect AI ``Model`` (``get_model()``: the model
of the task, which ``inspect eval --model`` chooses).

One ``complete`` is one ``Model.generate``: the conversation converted to Inspect's messages
(incrementally, see :class:`~._messages.Converter`), the tool specs as ``ToolInfo``, and
``parallel_tool_calls=False`` (the kernel executes one action per step). Inspect records the
call in the sample's transcript, counts its usage in the sample's totals and applies its own
retry policy (``--max-retries``, ``--timeout`` of ``inspect eval``), so an exception that
escapes ``generate`` is one Inspect already gave up on: it becomes a ``ModelCallError`` that is
not retried again (``retryable=False``), its ``kind`` by the HTTP status the provider sent
(``rate_limit``, ``server``, ``auth``, ... as the built-in adapters name them; ``error`` when
there is none). Inspect's own sample limits refusing the call (``LimitExceededError``) are
kind ``inspect_limit``: PolyLoop's budgets are set so that they stop the run first (see
:func:`polyloop.integrations.inspect.polyloop_agent`). A reply whose ``stop_reason`` is
``model_length`` (the prompt did not fit the context window) is kind ``context_length``, and
``content_filter`` is ``content_filter``; both are not retryable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from inspect_ai.model import ContentReasoning, GenerateConfig, Model, ModelOutput
from inspect_ai.tool import ToolInfo, ToolParams
from inspect_ai.util import LimitExceededError

from ...models._common import bad_response, content_filtered
from ...models._errors import KIND_BY_STATUS, by_status, describe
from ...types import ModelCallError, ModelReply, ModelRequest, ToolCall, ToolSpec, Usage
from ._messages import Converter

__all__ = ["InspectModel"]

_CONFIG: Final = GenerateConfig(parallel_tool_calls=False)


class InspectModel:
    """The Model seam over an Inspect ``Model``, for one run (it keeps the conversation it
    converted; make one per run).

    Args:
        model: the Inspect model; ``inspect_ai.model.get_model()`` (the task's) when None,
            resolved at construction (so build it inside a sample).
        config: a ``GenerateConfig`` merged over the model's for every call (temperature,
            max_tokens, ...); ``parallel_tool_calls`` is always False.

    ``name`` is ``"inspect:<provider>/<model>"``, journaled with each attempt.
    """

    def __init__(self, model: Model | None = None, *, config: GenerateConfig | None = None) -> None:
        if model is None:
            from inspect_ai.model import get_model

            model = get_model()
        self._model = model
        self._config = _CONFIG if config is None else config.merge(_CONFIG)
        self._where = f"Inspect model {model}"
        self._messages = Converter(self._where)
        self._specs: Sequence[ToolSpec] | None = None
        self._tools: list[ToolInfo] = []

    @property
    def name(self) -> str:
        """``"inspect:<provider>/<model>"``."""
        return f"inspect:{self._model}"

    @property
    def model(self) -> Model:
        """The Inspect model asked."""
        return self._model

    async def complete(self, request: ModelRequest) -> ModelReply:
        """One ``generate`` for ``request``.

        Returns:
            ``text`` (the reply's text parts), ``reasoning`` (its reasoning parts joined, None
            when it has none), ``tool_calls`` (arguments as the parsed object Inspect gives),
            ``call_id`` (the provider's response id), ``usage`` (Inspect's input, output,
            cache-read and reasoning tokens, and its cost when Inspect priced the call),
            ``model`` (the reply's model name).

        Raises:
            ModelCallError: not retryable (Inspect retried already); kinds as the module says.
        """
        messages = self._messages.convert(request.messages)
        tools = self._tool_infos(request.tool_specs)
        choice: Any = "none" if request.tool_choice == "none" else ("auto" if tools else None)
        try:
            output = await self._model.generate(
                messages, tools=tools, tool_choice=choice, config=self._config
            )
        except LimitExceededError as exc:
            raise ModelCallError(
                f"{self._where} was not called: Inspect's {exc.type} limit of {exc.limit} "
                "for the sample is reached",
                retryable=False,
                kind="inspect_limit",
            ) from exc
        except Exception as exc:
            raise _failure(exc, self._where) from exc
        return _reply(output, self._where)

    def _tool_infos(self, specs: Sequence[ToolSpec]) -> list[ToolInfo]:
        """The ``ToolInfo`` of each spec, converted once per distinct specs sequence (the
        registry hands out the same tuple until a tool is added)."""
        if specs is not self._specs:
            self._tools = [_tool_info(spec, self._where) for spec in specs]
            self._specs = specs
        return self._tools


def _tool_info(spec: ToolSpec, where: str) -> ToolInfo:
    fn = spec.get("function") or {}
    try:
        return ToolInfo(
            name=fn["name"],
            description=fn.get("description") or "",
            parameters=ToolParams.model_validate(fn.get("parameters") or {}),
        )
    except (KeyError, ValueError) as exc:
        raise ModelCallError(
            f"cannot send tool {fn.get('name')!r} to {where}: Inspect refuses its JSON schema "
            f"({describe(exc, with_cause=False)[:300]})",
            retryable=False,
            kind="bad_request",
        ) from exc


def _failure(exc: Exception, where: str) -> ModelCallError:
    """The ``ModelCallError`` of an exception from ``generate``: kind by the provider's HTTP
    status (on the exception or the one it was raised from; ``timeout`` and ``connection`` for
    Python's ``TimeoutError`` and ``ConnectionError`` without one), never retryable."""
    status = None
    for candidate in (exc, exc.__cause__):
        code = getattr(candidate, "status_code", None)
        if isinstance(code, int) and not isinstance(code, bool):
            status = code
            break
    if status is not None:
        kind, _ = by_status(KIND_BY_STATUS.get(status, ("error", False))[0], False, status)
    elif isinstance(exc, TimeoutError):
        kind = "timeout"
    elif isinstance(exc, ConnectionError):
        kind = "connection"
    else:
        kind = "error"
    shown = describe(exc, with_cause=True)
    shown = shown if len(shown) <= 500 else shown[:500] + "..."
    return ModelCallError(
        f"{type(exc).__name__} from {where} (after Inspect's retries): {shown}",
        retryable=False,
        kind=kind,
    )


def _reply(output: ModelOutput, where: str) -> ModelReply:
    if not output.choices:
        raise bad_response(where, f"a reply without choices ({output.error or 'no error given'})")
    choice = output.choices[0]
    if choice.stop_reason == "content_filter":
        raise content_filtered(where, "stop_reason content_filter")
    message = choice.message
    if choice.stop_reason == "model_length" and not message.tool_calls:
        raise ModelCallError(
            f"{where}: the prompt does not fit the model's context window ({message.text[:200]})",
            retryable=False,
            kind="context_length",
        )
    reasoning = []
    if not isinstance(message.content, str):
        reasoning = [c.reasoning for c in message.content if isinstance(c, ContentReasoning)]
    calls = tuple(
        ToolCall(call.function, dict(call.arguments), call.id or None)
        for call in message.tool_calls or ()
    )
    usage = output.usage
    return ModelReply(
        text=message.text,
        reasoning="\n\n".join(r for r in reasoning if r) or None,
        tool_calls=calls,
        call_id=output.response_id or None,
        usage=None
        if usage is None
        else Usage(
            usage.input_tokens,
            usage.output_tokens,
            cached_tokens=usage.input_tokens_cache_read,
            reasoning_tokens=usage.reasoning_tokens,
            cost_usd=usage.total_cost,
        ),
        model=output.model or None,
    )
