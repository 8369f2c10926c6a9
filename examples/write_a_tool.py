"""Writing tools: sync and async, an idempotency key, the three replay policies, a completion
marker, and a tool that reports its own ``Outcome``. Runs offline with a scripted model; swap
in a real model to use it for real.

    python examples/write_a_tool.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from polyloop import (
    ActionStatus,
    Limits,
    Loop,
    ModelReply,
    Outcome,
    RunResult,
    ToolCall,
    ToolContext,
    ToolRegistry,
)
from polyloop.testing import ScriptedModel


class Shop:
    """Stands in for the external system the tools change."""

    def __init__(self) -> None:
        self.stock = {"apple": 3, "pear": 0}
        self.orders: dict[str, tuple[str, int]] = {}  # by idempotency key
        self.charges: dict[str, float] = {}  # by idempotency key


def build_tools(shop: Shop) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")  # reading twice is harmless
    def check_stock(item: str) -> int:
        """How many of an item are in stock.

        Args:
            item: the item's name, e.g. "apple".
        """
        return shop.stock.get(item, 0)  # a sync tool runs in a worker thread

    @tools.tool(replay="idempotent")
    async def place_order(item: str, quantity: int, ctx: ToolContext) -> str | Outcome:
        """Order an item (refused when there is not enough stock)."""
        if shop.stock.get(item, 0) < quantity:
            # Nothing happened: say so, instead of reporting an ordinary result.
            return Outcome(ActionStatus.not_executed, f"only {shop.stock.get(item, 0)} {item}s")
        # ctx.op_id is journaled before the call and is the same if resume replays it: keyed by
        # it, placing the order twice has the effect of placing it once.
        shop.orders.setdefault(ctx.op_id, (item, quantity))
        return f"ordered {quantity} {item}s"

    def charge_happened(op_id: str, arguments: Mapping[str, Any]) -> Outcome | None:
        """Asked on resume when a charge's outcome was lost in a crash."""
        if op_id in shop.charges:
            return Outcome(ActionStatus.executed, f"charged {shop.charges[op_id]:.2f}")
        return None  # it did not happen: resume runs it

    @tools.tool(replay="reconcile", reconcile=charge_happened)
    async def charge(amount: float, ctx: ToolContext) -> str:
        """Charge the customer an amount in euros."""
        shop.charges[ctx.op_id] = amount
        return f"charged {amount:.2f}"

    @tools.tool(completion_marker=True)  # returning normally completes the run
    def submit(summary: str) -> str:
        """Report what was done; this ends the run."""
        return "submitted"

    return tools


def call(name: str, **arguments: object) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall(name, dict(arguments)),))


SCRIPT = [
    call("place_order", item="pear", quantity=2),
    call("check_stock", item="apple"),
    call("place_order", item="apple", quantity=2),
    call("charge", amount=1.5),
    call("submit", summary="2 apples, paid"),
]


async def shop_for_fruit(shop: Shop, model: ScriptedModel) -> RunResult:
    loop = Loop(model, tools=build_tools(shop), limits=Limits(max_steps=10))
    return await loop.run("Buy two pears, or two apples if there are no pears.")


def main() -> RunResult:
    result = asyncio.run(shop_for_fruit(Shop(), ScriptedModel(SCRIPT)))
    for step in result.steps:
        print(f"{step.action:45} {step.action_status:13} {step.observation}")
    print(f"stop_reason={result.stop_reason} steps={result.steps_used}")
    return result


if __name__ == "__main__":
    main()
