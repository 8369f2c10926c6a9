"""A faster ``__init__`` for the frozen, slotted dataclasses the kernel builds every step.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__(self,
name, value)``, a generic attribute lookup per field; a record of twenty fields spends most of
its construction there. :func:`fast_init` replaces it with one that stores each field through
its slot descriptor directly: the same signature (names, defaults, default factories,
keyword-only fields), the same ``__post_init__`` call, the same errors for missing or extra
arguments, and the class stays frozen for everyone else (``__setattr__`` still refuses).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")

# The default of a parameter whose field has a default_factory: the dataclass module's own
# marker (shown as ``<factory>`` in the signature), so that the signatures are equal.
_FACTORY: Any = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", object())


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass ``cls`` the faster ``__init__`` (see the module
    docstring). Raises TypeError for a class it does not apply to (not a frozen dataclass
    with slots, or one with ``InitVar`` fields, which it does not implement)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init needs a frozen dataclass with slots, not {cls!r}")
    every: Any = getattr(cls, "__dataclass_fields__", {})
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    initvar = getattr(dataclasses, "_FIELD_INITVAR", None)
    if any(getattr(f, "_field_type", None) is initvar for f in every.values()):
        raise TypeError(f"fast_init does not implement InitVar fields ({cls!r})")
    ns: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in fields:
        setter = f"_set_{f.name}"
        ns[setter] = cls.__dict__[f.name].__set__
        has_factory = f.default_factory is not dataclasses.MISSING
        if has_factory:
            ns[f"_factory_{f.name}"] = f.default_factory
        if not f.init:
            if has_factory:
                body.append(f"    {setter}(self, _factory_{f.name}())")
            elif f.default is not dataclasses.MISSING:
                ns[f"_default_{f.name}"] = f.default
                body.append(f"    {setter}(self, _default_{f.name})")
            continue
        if has_factory:
            param = f"{f.name}=_FACTORY"
            value = f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}"
        elif f.default is not dataclasses.MISSING:
            ns[f"_default_{f.name}"] = f.default
            param, value = f"{f.name}=_default_{f.name}", f.name
        else:
            param, value = f.name, f.name
        (keyword if f.kw_only else positional).append(param)
        body.append(f"    {setter}(self, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, ns)
    init = ns["__init__"]
    old = cls.__dict__["__init__"]
    init.__qualname__ = old.__qualname__
    init.__module__ = old.__module__
    init.__annotations__ = dict(old.__annotations__)
    init.__doc__ = old.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls
