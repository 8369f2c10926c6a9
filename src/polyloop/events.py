"""The events observers receive (kernel.md §9); see ``polyloop.types._events``."""

from .types._events import *  # noqa: F403 (the names its __all__ lists, defined there once)
from .types._events import __all__ as __all__
