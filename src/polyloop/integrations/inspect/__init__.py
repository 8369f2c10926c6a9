"""PolyLoop as an Inspect AI agent (extra ``polyloop[inspect]``).

::

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from polyloop import ToolRegistry
    from polyloop.integrations.inspect import polyloop_agent

    tools = ToolRegistry()

    @tools.tool
    def add(a: int, b: int) -> int:
        '''Add two integers.'''
        return a + b

    @task
    def arithmetic() -> Task:
        return Task(
            dataset=[Sample(input="What is 2 + 3?", target="5")],
            solver=polyloop_agent(tools),
            scorer=includes(),
        )

``inspect eval arithmetic.py --model openai/gpt-4o-mini`` runs each sample as one journaled
PolyLoop run (``polyloop.sqlite`` beside the eval log); ``inspect eval-retry`` of a crashed
eval resumes its samples' runs. :func:`polyloop_agent` says what maps to what.
"""

from __future__ import annotations

from polyloop.types import import_extra

import_extra(
    "inspect_ai", "PolyLoop's Inspect agent needs inspect-ai: pip install 'polyloop[inspect]'"
)

from ._agent import METADATA_KEY, polyloop_agent  # noqa: E402
from ._model import InspectModel  # noqa: E402
from ._sample import JOURNAL_ENV, budgets, sample_run_id  # noqa: E402
from ._tools import add_inspect_tools  # noqa: E402

__all__ = [
    "JOURNAL_ENV",
    "METADATA_KEY",
    "InspectModel",
    "add_inspect_tools",
    "budgets",
    "polyloop_agent",
    "sample_run_id",
]
