"""The kernel: one run through the stop order, write-ahead, resume. Imports only types and
seams (layout.md rule 2); ``polyloop.Loop`` wires the adapters around it."""

from .core import Kernel
from .driver import KernelConfig
from .ids import new_id

__all__ = ["Kernel", "KernelConfig", "new_id"]
