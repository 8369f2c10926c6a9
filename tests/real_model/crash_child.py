"""The child of the kill -9 scenario: runs :func:`crash_loop`'s run against the real server
and prints ``sent`` once the model call's request is on the wire (its body is written to
SENT first), so the parent can SIGKILL it mid-call.

    python -m tests.real_model.crash_child JOURNAL BASE_URL RUN_ID SENT
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from polyloop import Limits, Loop
from polyloop.journal import SQLiteJournal

from .support import Wire, forced
from .tools import arithmetic

# Long enough that the server needs a while to read it: the kill lands while it does.
GOAL = (
    "Here is a list of numbers: "
    + ", ".join(str(n * 7 % 101) for n in range(300))
    + ". Submit how many numbers the list has with the submit tool."
)
LIMITS = Limits(max_steps=3)


def crash_loop(wire: Wire, journal: SQLiteJournal) -> Loop:
    """The loop of the scenario, the same in the child and in the resuming parent: every step
    is a forced ``submit``, so the run ends ``task_completed`` on its first step."""
    return Loop(
        wire.model(tool_choice=forced("submit")),
        tools=arithmetic(),
        journal=journal,
        limits=LIMITS,
    )


async def main(db: str, base_url: str, run_id: str, sent: str) -> None:
    def on_sent() -> None:
        Path(sent).write_text(json.dumps(wire.exchanges[-1].sent))
        print("sent", flush=True)

    wire = Wire(base_url, on_sent=on_sent)
    async with SQLiteJournal(db) as journal:
        await crash_loop(wire, journal).run(GOAL, run_id=run_id)
    print("finished", flush=True)  # the parent kills this process before it gets here


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
