"""How the ``polyloop`` command shows the library's warnings: each as one line on stderr,
``polyloop: warning: ...``, as it is logged (the ``polyloop`` logger, level WARNING and above),
with the exception it carries, if any, as its type and message at the end of the line instead
of a traceback. A warning the library logs once (a server that refuses to stream, say) is
printed once."""

from __future__ import annotations

import logging
import sys

__all__ = ["show_warnings"]


class _OneLine(logging.Handler):
    """Writes each record to the ``sys.stderr`` of the moment it is logged."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                text += f" ({type(exc).__name__}: {exc})"
            print(f"polyloop: warning: {' '.join(text.split())}", file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


_HANDLER = _OneLine(logging.WARNING)


def show_warnings() -> None:
    """Print the ``polyloop`` logger's warnings on stderr from now on (idempotent). The
    logger's own level is left as it is."""
    logger = logging.getLogger("polyloop")
    if _HANDLER not in logger.handlers:
        logger.addHandler(_HANDLER)
