"""What an MCP tool's schema and result become in PolyLoop: a validator for the arguments, and
the observation of a ``CallToolResult``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import mimetypes
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import mcp_types
from jsonschema.exceptions import SchemaError, ValidationError

from polyloop.types import ActionStatus, Failure, Outcome, canonical_json

from .._output import HeadTail
from ..registry import InvalidArguments

log = logging.getLogger("polyloop.tools.mcp")

_MAX_PROBLEMS = 20
_SHOWN_CHARS = 80


def arguments_validator(
    schema: Mapping[str, Any], *, where: str
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """``validate(arguments) -> arguments`` against the server's JSON schema (its own
    ``$schema`` dialect, else 2020-12, the MCP default). A schema that is itself invalid is
    logged and only the object shape is checked: the server stays usable and judges the rest.
    """
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
        validator: Any = cls(schema)
    except SchemaError as exc:
        log.warning("%s: its input schema is not valid JSON Schema (%s)", where, exc.message)
        validator = cls({"type": "object"})

    def validate(arguments: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(arguments)
        errors = sorted(validator.iter_errors(values), key=lambda e: list(map(str, e.path)))
        if errors:
            problems = [_problem(e) for e in errors[:_MAX_PROBLEMS]]
            if len(errors) > _MAX_PROBLEMS:
                problems.append(f"... and {len(errors) - _MAX_PROBLEMS} more problems")
            raise InvalidArguments(problems)
        return values

    return validate


def _problem(error: ValidationError) -> str:
    """One schema violation as a line a model can act on (``'count': 'x' is not of type
    'integer'``), named by its path in the arguments."""
    where = ""
    for part in error.absolute_path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    if error.validator == "required" and isinstance(error.validator_value, list):
        present = error.instance if isinstance(error.instance, dict) else {}
        missing = [name for name in error.validator_value if name not in present]
        if missing:
            name = f"{where}.{missing[0]}" if where else str(missing[0])
            kind = "field" if where else "argument"
            return f"{name!r}: required {kind} missing"
    message = error.message
    if len(message) > 200:
        message = message[:199] + "…"
    return f"{where or 'arguments'!r}: {message}"


async def result_outcome(
    result: mcp_types.CallToolResult,
    *,
    tool: str,
    store: Callable[[bytes, str | None], Any] | None,
    empty_error: str,
    max_chars: int | None,
    omitted: str,
) -> Outcome:
    """The Outcome of a result the server sent.

    The observation is the text blocks, one per line group, in order; structured content as
    canonical JSON (on its own when there is no text, else after it unless the text already
    is that JSON); each image, audio clip or binary resource as one line giving its type, size
    and URI (and, with ``store``, the file it was saved to: ``store(data, mime) -> path``,
    awaited); a resource link as one line with its URI. ``isError`` makes it an executed
    failure whose observation is the server's error text.

    Of an observation longer than ``max_chars`` (None: no cap), the first and the last half
    are kept with ``omitted`` (placeholder ``omitted``) between them, and the characters cut
    are the outcome's ``truncated_chars``.
    """
    parts: list[str] = []
    texts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
            texts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(await _binary_line(block.type, block.data, block.mime_type, None, store))
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(_link_line(block))
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                mime = f" {resource.mime_type}" if resource.mime_type else ""
                parts.append(f"[resource {resource.uri}{mime}, {len(resource.text)} chars]")
                parts.append(resource.text)
            else:
                parts.append(
                    await _binary_line(
                        "resource", resource.blob, resource.mime_type, resource.uri, store
                    )
                )
    structured = result.structured_content
    if structured is not None and not _covered(texts, structured):
        shown = canonical_json(structured)
        parts.append(shown if not texts else f"structured content: {shown}")
    observation, cut = _capped(parts, max_chars, omitted)
    if result.is_error:
        message = observation.strip() or empty_error.format(tool=tool)
        return Outcome(
            ActionStatus.executed,
            observation or message,
            synthetic=not observation,
            failure=Failure(
                error_type="MCPToolError", message=message.splitlines()[0][: _SHOWN_CHARS * 4]
            ),
            truncated_chars=cut,
        )
    return Outcome(ActionStatus.executed, observation, truncated_chars=cut)


def _capped(parts: list[str], max_chars: int | None, omitted: str) -> tuple[str, int]:
    """``parts`` joined by newlines, cut to ``max_chars`` (see ``result_outcome``), and the
    characters cut; the whole text is never built when it is longer."""
    if max_chars is None:
        return "\n".join(parts), 0
    kept = HeadTail(max_chars)
    for i, part in enumerate(parts):
        if i:
            kept.add("\n")
        kept.add(part)
    if not kept.omitted:
        return kept.head + kept.tail, 0
    return kept.head + omitted.format(omitted=kept.omitted) + kept.tail, kept.omitted


def _covered(texts: list[str], structured: Any) -> bool:
    """The text blocks already say what the structured content does (servers SHOULD send
    both, for clients that read only text): they are its JSON, or each of its values appears
    in them. It is not repeated then."""
    if not texts:
        return False
    if len(texts) == 1:
        try:
            if json.loads(texts[0]) == structured:
                return True
        except ValueError:
            pass
    joined = "\n".join(texts)
    leaves = list(_leaves(structured))
    return bool(leaves) and all(leaf in joined for leaf in leaves)


def _leaves(value: Any) -> Any:
    """The scalar values of a JSON value, as text (strings as they are)."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, str):
        yield value
    elif value is not None:
        yield json.dumps(value)


async def _binary_line(
    kind: str,
    data: str,
    mime: str | None,
    uri: str | None,
    store: Callable[[bytes, str | None], Any] | None,
) -> str:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    fields = [f"[{kind}"]
    if uri:
        fields.append(f" {uri}")
    fields.append(f" {mime or 'application/octet-stream'}")
    if raw is None:
        return "".join(fields) + f", {len(data)} chars of invalid base64]"
    fields.append(f", {len(raw)} bytes")
    if store is not None:
        path = await store(raw, mime)
        fields.append(f", saved as {path}")
    else:
        fields.append(f", sha256 {hashlib.sha256(raw).hexdigest()[:16]}")
    return "".join(fields) + "]"


def _link_line(link: mcp_types.ResourceLink) -> str:
    details = [link.name] if link.name else []
    if link.mime_type:
        details.append(link.mime_type)
    if link.size is not None:
        details.append(f"{link.size} bytes")
    inner = f" ({', '.join(details)})" if details else ""
    return f"[resource link {link.uri}{inner}]"


def stored_name(raw: bytes, mime: str | None) -> str:
    """The file name of stored content: its SHA-256 (so a replayed call writes the same file,
    never a second one) and an extension from its MIME type."""
    ext = mimetypes.guess_extension(mime or "") or ".bin"
    return hashlib.sha256(raw).hexdigest()[:32] + ext


def write_stored(folder: Path, raw: bytes, mime: str | None) -> Path:
    """Write ``raw`` under ``folder`` (created) by :func:`stored_name`, atomically; return its
    path. Blocking: call it in a worker thread."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / stored_name(raw, mime)
    if not path.exists():
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(raw)
        partial.replace(path)
    return path
