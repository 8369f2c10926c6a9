"""Model adapters: implementations of the Model seam over real providers.

* :mod:`polyloop.models.openai` — ``OpenAIModel``, any OpenAI-compatible chat completions
  server, on the official ``openai`` SDK (extra ``polyloop[openai]``).
* :mod:`polyloop.models.openai_responses` — ``OpenAIResponsesModel``, OpenAI's Responses API
  (for its reasoning models: reasoning summaries), on the same SDK and extra.
* :mod:`polyloop.models.anthropic` — ``AnthropicModel``, Anthropic's Messages API, on the
  official ``anthropic`` SDK (extra ``polyloop[anthropic]``).
* :mod:`polyloop.models.gemini` — ``GeminiModel``, Google's Gemini API, on the official
  ``google-genai`` SDK (extra ``polyloop[gemini]``).
* :mod:`polyloop.models.fallback` — ``FallbackModel``, several models in order: the next is
  asked when one fails with a rate limit, a server or connection error or a timeout (no extra;
  also ``polyloop.FallbackModel``).

Each adapter lives in its own module and imports its SDK lazily, so importing this package
never needs an extra installed. Each reports ``Usage`` with its cached and reasoning parts and
the ``model`` that answered, maps its SDK's failures to ``ModelCallError`` kinds (a content
filter's to ``content_filter``), and takes ``stream=True`` to stream each reply, its pieces
passed to ``ModelRequest.on_delta`` (``ModelDelta`` events in a run) while ``complete`` still
returns the one complete reply; a stream cut off is a failed attempt (``connection``). A server
that refuses to stream (``OpenAIModel``: an event stream that ends before its first event, as
llama-cpp-python's server sends for a tool call under ``tool_choice`` "auto") is another
failure, kind ``stream_refused``: that adapter sends its later requests whole.

A provider's context-length error is kind ``context_length``; the run ends ``llm_error`` (never
``context_overflow``, which is PolyLoop's own ``max_prompt_chars`` check before the call).
Exceptions that are neither an SDK's nor its HTTP transport's propagate unchanged (the kernel
counts them non-retryable); ``asyncio.CancelledError`` always propagates.

Each adapter module holds only its provider's wire format (building a request, reading a reply
or a stream, what its SDK's exceptions mean); what they do alike is one private core:
``_errors`` (a failure's kind, retry-after, the message), ``_base`` (settings, the SDK client,
the read-only facts, the lifetime), ``_common`` (replies, usage, streams) and ``_http``.
"""

from __future__ import annotations

__all__: list[str] = []
