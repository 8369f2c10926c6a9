"""The canonical JSON form: the one JSON PolyLoop stores, hashes and measures."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["canonical_json"]

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_encoder() -> Callable[[Any], str] | None:
    """The C encoder behind ``_CANONICAL``, made once. ``JSONEncoder.encode`` builds a new
    one on every call, which costs more than encoding a small record."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the _json accelerator
        return None
    # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys,
    # allow_nan): exactly what _CANONICAL.iterencode passes. The markers dict detects cycles;
    # a failed call can leave ids in it, so it is emptied then (ids get reused).
    markers: dict[int, Any] = {}
    encode = make(
        markers, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )
    join = "".join

    def fast(value: Any) -> str:
        try:
            return join(encode(value, 0))
        except BaseException:
            markers.clear()
            raise

    return fast


_FAST = _c_encoder()


def canonical_json(value: Any) -> str:
    """The one JSON form PolyLoop stores and measures: sorted keys, no spaces, real unicode
    (``json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``).

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
        ValueError: ``value`` contains itself.
    """
    if _FAST is None:
        return _CANONICAL.encode(value)
    return _FAST(value)
