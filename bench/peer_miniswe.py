"""mini-swe-agent: its ``DefaultAgent`` with its own scripted ``DeterministicModel`` (each output
carries the parsed action, as its test suite does) and a no-op environment in place of the bash
one (the ``Environment`` protocol: ``execute(action) -> dict``). The run's last action is
``submit``, which the environment answers with mini-swe-agent's ``Submitted`` exit — its only
way to finish (there is no final-answer text). No trajectory file (``output_path=None``).

Synchronous: concurrent runs use one thread each; model latency is ``time.sleep``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from minisweagent.agents.default import DefaultAgent
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

from ._measure import FINAL_ANSWER, GOAL, TOOL_NAME, TOOL_RESULT, Measured, Spec, timed


class NoopEnvironment:
    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None):
        if action.get("command") == "submit":
            raise Submitted(
                {
                    "role": "exit",
                    "content": FINAL_ANSWER,
                    "extra": {"exit_status": "Submitted", "submission": FINAL_ANSWER},
                }
            )
        return {"output": TOOL_RESULT, "returncode": 0, "exception_info": ""}

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {}

    def serialize(self) -> dict[str, Any]:
        return {}


class SlowModel(DeterministicModel):
    def __init__(self, latency_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.latency_s = latency_s

    def query(self, messages: list[dict[str, str]], **kwargs: Any) -> dict[str, Any]:
        if self.latency_s:
            time.sleep(self.latency_s)
        return super().query(messages, **kwargs)


def _outputs(steps: int) -> list[dict[str, Any]]:
    call = {"command": TOOL_NAME}
    return [make_output("", [call], cost=0.0) for _ in range(steps - 1)] + [
        make_output("", [{"command": "submit"}], cost=0.0)
    ]


def _one(steps: int, latency_s: float) -> None:
    model = SlowModel(latency_s, outputs=_outputs(steps), cost_per_call=0.0)
    agent = DefaultAgent(
        model,
        NoopEnvironment(),
        system_template="You are an agent.",
        instance_template="{{task}}",
        step_limit=steps + 1,
        cost_limit=0.0,
    )
    out = agent.run(GOAL)
    assert out.get("exit_status") == "Submitted", out
    assert model.current_index == steps - 1


def _batches(spec: Spec) -> None:
    latency = spec.latency_ms / 1000
    for _ in range(spec.batches):
        if spec.runs == 1:
            _one(spec.steps, latency)
            continue
        with ThreadPoolExecutor(max_workers=spec.runs) as pool:
            list(pool.map(lambda _: _one(spec.steps, latency), range(spec.runs)))


async def measure(spec: Spec) -> Measured:
    _one(5, 0.0)

    async def go() -> None:
        _batches(spec)

    wall, cpu, _ = await timed(go)
    return Measured(wall, cpu)
