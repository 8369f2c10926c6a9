"""Interpreters: the decision seam. Each turns one model reply into exactly one ``Action``,
``FinalAnswer`` or ``InvalidDecision`` (tools.md, "Interpreters").

* :class:`NativeToolCallInterpreter`: the reply's native tool call is the action.
* :class:`JsonTextInterpreter`: a JSON object in the reply text names a tool and arguments,
  or gives the final answer.
* :class:`CodeBlockInterpreter`: the first fenced code block is the action (the code itself).
"""

from .code_block import CodeBlockInterpreter
from .json_text import JsonTextInterpreter
from .native import NativeToolCallInterpreter

__all__ = ["CodeBlockInterpreter", "JsonTextInterpreter", "NativeToolCallInterpreter"]
