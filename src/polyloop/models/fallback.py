"""``FallbackModel``: ask the next model when one fails in a way another model may not.

``FallbackModel(primary, *others)`` is a model made of models, in order. In a run, the kernel
drives it (it is a :class:`~polyloop.seams.ModelChain`): each step asks ``primary`` first, with
the loop's retry policy; when an attempt fails with a kind in ``fallback_on`` and that failure
is not retried (the policy's attempts are spent, the error is not retryable, or the provider
asked to wait longer than ``RetryPolicy.max_retry_after_s``), the next attempt asks the next
model, with a fresh retry budget. The step after asks ``primary`` again: a fallback lasts for
one step's model call, so a recovered primary is back at once.

Every attempt is a ``model_calls`` row whose ``model`` column names the model it asked (its
``name``, e.g. ``"anthropic:claude-sonnet-4-5"``), the attempt that fell back has state
``retried``, and the step's ``StepRecord.model`` says which model answered. Resume continues
with the model the journal says is next (a fallback is journaled before the next model is
asked). A failure of a kind not in ``fallback_on`` ends the run ``llm_error`` as with one model,
and so does the last model's failure.

Once an attempt of a step has streamed partial output to observers (``ModelDelta`` events),
the step does not fall back: recovery stays with the model that showed it (its later attempts
are retried per the policy, then ``llm_error``), so that an answer in view is not replaced by
another model's. The rule holds for the whole step, not only the attempt that showed the
output: a retry that fails before any delta stays with that model too. The kernel keeps this
per step, in the journal (``ModelAttemptFailed.partial_shown``), so a resumed step obeys it as
well; an attempt cut off by a crash leaves no such record, and its resume may fall back. The
next step starts with ``primary`` again.

Default ``fallback_on``: ``rate_limit``, ``server``, ``connection``, ``timeout`` (the
``ModelCallError.kind`` values of the built-in adapters). Add ``context_length`` to fall back to
a model with a longer context, ``auth`` to fall back from a provider whose key was revoked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from ..seams import Model, model_name
from ..types import ConfigError, ModelCallError, ModelReply, ModelRequest

__all__ = ["DEFAULT_FALLBACK_ON", "FallbackModel"]

DEFAULT_FALLBACK_ON: frozenset[str] = frozenset({"rate_limit", "server", "connection", "timeout"})
"""The failure kinds that make a ``FallbackModel`` ask its next model by default."""


class FallbackModel:
    """``primary``, then each of ``others`` in turn, on a failure of a kind in ``fallback_on``
    (see the module docstring for how a run drives it).

    Args:
        primary: the model asked first at every step.
        *others: the models asked next, in order (at least one).
        fallback_on: ``ModelCallError.kind`` values that move on to the next model (default
            :data:`DEFAULT_FALLBACK_ON`). An exception that is not a ``ModelCallError`` never
            falls back: it is a bug or a broken adapter, not a provider's bad moment.

    Raises:
        ConfigError: fewer than two models, a model without ``complete``, or ``fallback_on``
            not a collection of strings.
    """

    def __init__(
        self, primary: Model, *others: Model, fallback_on: Iterable[str] = DEFAULT_FALLBACK_ON
    ) -> None:
        models = (primary, *others)
        if not others:
            raise ConfigError("FallbackModel needs a primary model and at least one other")
        for i, m in enumerate(models):
            if not callable(getattr(m, "complete", None)):
                raise ConfigError(
                    f"FallbackModel: model {i} ({m!r}) has no async complete(request) method"
                )
        if isinstance(fallback_on, str):
            raise ConfigError(
                f"FallbackModel fallback_on must be a collection of kinds, not the string "
                f"{fallback_on!r}; e.g. fallback_on={{'rate_limit', 'server'}}"
            )
        kinds = frozenset(fallback_on)
        if not all(isinstance(k, str) and k for k in kinds):
            raise ConfigError(f"FallbackModel fallback_on must hold kind strings, got {kinds!r}")
        self._models = models
        self._fallback_on = kinds

    @property
    def models(self) -> Sequence[Model]:
        """The models in the order they are asked."""
        return self._models

    @property
    def fallback_on(self) -> frozenset[str]:
        """The failure kinds that move on to the next model."""
        return self._fallback_on

    @property
    def name(self) -> str:
        """``fallback(<name of each model>)``; a model without a name shows as ``?``."""
        return "fallback(" + ", ".join(model_name(m) or "?" for m in self._models) + ")"

    def __repr__(self) -> str:
        inner = ", ".join(repr(m) for m in self._models)
        return f"FallbackModel({inner}, fallback_on={sorted(self._fallback_on)!r})"

    async def complete(self, request: ModelRequest) -> ModelReply:
        """Outside a run: ask each model once, in order, moving on after a ``ModelCallError``
        of a kind in ``fallback_on``; the last model's failure propagates, and so does the
        failure of a model that had already passed part of its reply to ``request.on_delta``
        (the next model would replace an answer in view). (In a run the kernel drives the
        models itself, so that every attempt is journaled and retried.)"""
        last = len(self._models) - 1
        shown = False
        on_delta = request.on_delta
        if on_delta is not None:

            def seen(kind: str, text: str) -> None:
                nonlocal shown
                shown = True
                on_delta(kind, text)

            request = dataclasses.replace(request, on_delta=seen)
        for i, model in enumerate(self._models):
            try:
                return await model.complete(request)
            except ModelCallError as exc:
                if i == last or exc.kind not in self._fallback_on or shown:
                    raise
        raise AssertionError("unreachable: the last model returns or raises")
