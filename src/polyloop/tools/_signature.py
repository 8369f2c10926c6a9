"""A Python function read as a tool: the description the model reads (the docstring's first
paragraph), and the pydantic model that validates its arguments with the JSON schema made from
that same model (the signature, with the ``Args:`` section's descriptions), so that what the
model is told and what is accepted cannot drift apart (tools.md, "The registry")."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic

from polyloop.types import ConfigError, ToolContext

from ._docstrings import arg_descriptions, summary

__all__ = ["Param", "Signature", "read_function"]

# Keys whose value maps names to sub-schemas: their keys are names, never the "title" keyword.
_SCHEMA_MAPS = frozenset(
    {"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"}
)
_SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
_SCHEMA_ONE = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)


@dataclass(frozen=True, slots=True)
class Param:
    """One schema parameter: the pydantic field name (``field``) maps to the Python
    parameter (``name``); fields are named ``p0, p1, ...`` with the parameter name as alias,
    so that parameter names pydantic reserves (``model_config``, ``json``, ``_x``) still work."""

    name: str
    field: str


@dataclass(frozen=True, slots=True)
class Signature:
    """What a function gives a tool: its description, the arguments model and its JSON schema,
    the schema parameters, the call order, the injected ``ToolContext`` parameter, whether it
    is awaited, and the file that defines it (for ``Failure.top_frame``)."""

    description: str
    model: type[pydantic.BaseModel]
    schema: dict[str, Any]
    params: tuple[Param, ...]
    call_order: tuple[tuple[str, bool], ...]
    context_parameter: str | None
    is_async: bool
    source_file: str | None


def read_function(where: str, tool_name: str, func: Callable[..., Any]) -> Signature:
    """Read ``func`` (a function, a ``functools.partial`` or a callable object) as the tool
    ``tool_name``; ``where`` names it in errors.

    Raises:
        ConfigError: no docstring, or one that starts with a section; ``*args`` or
            ``**kwargs``; a signature or annotations that cannot be read; a type with no JSON
            schema; two ``ToolContext`` parameters; an ``Args:`` entry for no parameter.
    """
    target = _implementation(func)
    description, arg_docs = _documentation(where, func, target)
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot read its signature: {exc}") from exc
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as exc:
        raise ConfigError(
            f"{where}: cannot resolve its annotations ({type(exc).__name__}: {exc}); "
            "import the annotated types at module level"
        ) from exc

    undocumented = dict(arg_docs)
    params: list[Param] = []
    call_order: list[tuple[str, bool]] = []
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for index, p in enumerate(signature.parameters.values()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            raise ConfigError(
                f"{where}, parameter {star}{p.name}: tools cannot take *args or **kwargs "
                "(the model needs a fixed set of named arguments)"
            )
        positional = p.kind is p.POSITIONAL_ONLY
        call_order.append((p.name, positional))
        described = undocumented.pop(p.name, None)
        annotation = hints.get(p.name, Any)
        if _is_context(annotation):
            if context_param is not None:
                raise ConfigError(
                    f"{where}, parameter {p.name!r}: only one ToolContext parameter is "
                    f"allowed (already {context_param!r})"
                )
            context_param = p.name
            continue
        _check_json_schema(where, p.name, annotation)
        field_name = f"p{index}"
        default: Any = ... if p.default is p.empty else p.default
        info = (
            pydantic.Field(default, alias=p.name)
            if described is None
            else pydantic.Field(default, alias=p.name, description=described)
        )
        fields[field_name] = (annotation, info)
        params.append(Param(p.name, field_name))
    if undocumented:
        raise ConfigError(
            f"{where}: its docstring's Args section documents {sorted(undocumented)}, "
            "which are not parameters of the function; fix the docstring"
        )
    try:
        model: type[pydantic.BaseModel] = pydantic.create_model(
            tool_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        schema = _strip_titles(model.model_json_schema())
    except Exception as exc:
        raise ConfigError(
            f"{where}: cannot build its argument schema ({type(exc).__name__}: {exc})"
        ) from exc
    code = getattr(target, "__code__", None)
    return Signature(
        description=description,
        model=model,
        schema=schema,
        params=tuple(params),
        call_order=tuple(call_order),
        context_parameter=context_param,
        is_async=_is_async(func, target),
        source_file=code.co_filename if code is not None else None,
    )


def _documentation(
    where: str, func: Callable[..., Any], target: Callable[..., Any]
) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and the ``Args:`` descriptions by parameter name."""
    doc = inspect.getdoc(target if isinstance(func, functools.partial) else func)
    if not doc and not inspect.isroutine(func):
        doc = inspect.getdoc(target)
    if not doc or not doc.strip():
        raise ConfigError(
            f"{where} has no docstring; the model reads it as the tool's description, "
            "so write one saying what the tool does"
        )
    description = summary(doc)
    if not description:
        raise ConfigError(
            f"{where}: its docstring starts with a section; begin it with a line saying what "
            "the tool does (the model reads it as the tool's description)"
        )
    return description, arg_descriptions(doc)


def _check_json_schema(where: str, param: str, annotation: Any) -> None:
    try:
        pydantic.TypeAdapter(annotation).json_schema()
    except Exception as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(
            f"{where}, parameter {param!r}: its type {_type_name(annotation)} cannot be "
            f"expressed as JSON schema ({type(exc).__name__}: {first_line}); use JSON-like "
            "types (str, int, float, bool, list, dict, enums, pydantic models)"
        ) from exc


def _is_async(func: Callable[..., Any], target: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    # An object whose __call__ is a coroutine function.
    return (
        not inspect.isroutine(func)
        and not isinstance(func, functools.partial)
        and inspect.iscoroutinefunction(target)
    )


def _implementation(func: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations, docstring and code describe ``func``: through
    ``functools.partial`` and ``functools.wraps`` layers, and to ``__call__`` of an object."""
    target: Any = func
    while isinstance(target, functools.partial):
        target = target.func
    target = inspect.unwrap(target)
    if not inspect.isroutine(target):
        target = inspect.unwrap(type(target).__call__)
    return typing.cast(Callable[..., Any], target)


def _is_context(annotation: Any) -> bool:
    """``ToolContext``, ``ToolContext | None`` or ``Annotated[ToolContext, ...]``."""
    if annotation is ToolContext:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_context(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(members) == 1 and members[0] is ToolContext
    return False


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation)


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's ``title`` keywords, keeping properties or definitions *named* title
    and leaving values (``default``, ``enum``, ``const``, ``examples``) untouched."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_strip_titles(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = _strip_titles(value)
        else:
            out[key] = value
    return out
