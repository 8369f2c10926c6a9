"""A custom environment: run the Python code of the model's code blocks in a subprocess, with
a timeout, and signal completion when a check passes. Runs offline with a scripted model; swap
in a real model to use it for real.

    python examples/custom_environment.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from polyloop import (
    Action,
    ActionStatus,
    EnvironmentFailure,
    Failure,
    Limits,
    Loop,
    Outcome,
    OutcomeUnknown,
    ReplayPolicy,
    RunResult,
    ToolContext,
)
from polyloop.context import ChatContextBuilder
from polyloop.interpreters import CodeBlockInterpreter
from polyloop.testing import ScriptedModel
from polyloop.types import ToolSpec


class PythonEnvironment:
    """Runs each action's code with ``python -c`` in ``workdir`` (the Environment seam).

    After each run of the model's code, ``check`` (Python code, run the same way) decides
    completion: exit status 0 means the goal is reached.
    """

    def __init__(self, workdir: Path, check: str, *, timeout_s: float = 10.0) -> None:
        self.workdir = workdir
        self.check = check
        self.timeout_s = timeout_s

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return ()  # no tools: the action is the code itself

    async def execute(self, action: Action, ctx: ToolContext) -> Outcome:
        if action.tool_name is not None:
            return Outcome(ActionStatus.not_executed, "This environment runs code, not tools.")
        status, output = await self._python(action.text)
        if status is None:
            return Outcome(
                ActionStatus.executed,  # it ran (and may have changed files) until it was killed
                f"{output}\n[timed out after {self.timeout_s:g}s; the process was killed]",
                failure=Failure(error_type="TimeoutError", message="the code timed out"),
            )
        if status != 0:
            output += f"\n[exit status {status}]"
        check_status, _ = await self._python(self.check)
        if check_status is None:  # could not tell: that is the environment's failure
            raise EnvironmentFailure(f"the completion check timed out after {self.timeout_s:g}s")
        return Outcome(ActionStatus.executed, output, completed=check_status == 0)

    def replay_policy(self, action: Action) -> ReplayPolicy:
        # Arbitrary code may have done anything: resume must never run it again blindly.
        return ReplayPolicy.never

    async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None:
        raise OutcomeUnknown("cannot tell whether a piece of code ran")  # only with "reconcile"

    async def _python(self, code: str) -> tuple[int | None, str]:
        """Run ``code``; return its exit status (None if it timed out) and its output."""
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                code,
                cwd=self.workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            raise EnvironmentFailure(f"cannot start Python: {exc}") from exc
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except TimeoutError:
            return None, ""
        finally:
            if process.returncode is None:  # timed out or cancelled: never leave it running
                process.kill()
                await process.wait()
        return process.returncode, output.decode(errors="replace")


CHECK = "from pathlib import Path; assert Path('answer.txt').read_text().strip() == '6765'"

SCRIPT = [
    "I will compute the 20th Fibonacci number first.",  # no code block: invalid, with feedback
    "```python\na, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b\nprint(a)\n```",
    "```python\nfrom pathlib import Path\nPath('answer.txt').write_text('6765')\n```",
]


async def solve(workdir: Path, model: ScriptedModel) -> RunResult:
    interpreter = CodeBlockInterpreter(language="python")
    context = ChatContextBuilder(
        system_prompt="You solve tasks by running Python code. " + interpreter.instructions
    )
    loop = Loop(
        model,
        environment=PythonEnvironment(workdir, CHECK),
        interpreter=interpreter,
        context=context,
        limits=Limits(max_steps=5),
    )
    return await loop.run("Write the 20th Fibonacci number to answer.txt.")


def main() -> RunResult:
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(solve(Path(tmp), ScriptedModel(SCRIPT)))
    for step in result.steps:
        shown = step.observation if step.parse_ok else f"invalid: {step.parse_error}"
        print(f"step {step.step_idx}: completed={step.completed} {shown!r}")
    print(f"stop_reason={result.stop_reason} steps={result.steps_used}")
    return result


if __name__ == "__main__":
    main()
