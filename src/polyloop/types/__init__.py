"""PolyLoop's value types: no I/O, no imports from the rest of PolyLoop (layout.md rule 1).

Each name is listed once, in the ``__all__`` of the module that defines it, which this package
re-exports; of four modules it takes only the names the rest of PolyLoop uses."""

# ruff: noqa: F403
from . import (
    _canonical,
    _enums,
    _errors,
    _events,
    _fast,
    _guards,
    _ledger,
    _limits,
    _model_io,
    _nesting,
    _records,
    _records_json,
    _report,
    _requests,
    _runs,
    _step,
    _templates,
    _text,
    _tool_context,
    _values,
)
from ._canonical import *
from ._checks import check_number
from ._enums import *
from ._errors import *
from ._events import *
from ._extras import import_extra
from ._fast import *
from ._guards import *
from ._ledger import *
from ._limits import *
from ._model_io import *
from ._nesting import *
from ._records import *
from ._records_form import record_from_dict, record_to_dict
from ._records_json import *
from ._report import *
from ._requests import *
from ._runs import *
from ._step import *
from ._templates import *
from ._text import *
from ._tool_context import *
from ._usage import Pricing, Usage, usage_refusal
from ._values import *

__all__ = [
    "Pricing",
    "Usage",
    "check_number",
    "import_extra",
    "record_from_dict",
    "record_to_dict",
    "usage_refusal",
]
__all__ += _canonical.__all__
__all__ += _enums.__all__
__all__ += _errors.__all__
__all__ += _events.__all__
__all__ += _fast.__all__
__all__ += _guards.__all__
__all__ += _ledger.__all__
__all__ += _limits.__all__
__all__ += _model_io.__all__
__all__ += _nesting.__all__
__all__ += _records.__all__
__all__ += _records_json.__all__
__all__ += _report.__all__
__all__ += _requests.__all__
__all__ += _runs.__all__
__all__ += _step.__all__
__all__ += _templates.__all__
__all__ += _text.__all__
__all__ += _tool_context.__all__
__all__ += _values.__all__
