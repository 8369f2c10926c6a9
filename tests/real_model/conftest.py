"""Fixtures of the real-model suite: a real llama.cpp server (llama-cpp-python) with a real
model (Gemma 3 270M), started on 127.0.0.1 and stopped by its pid.

The suite is marked ``real_model`` and the default ``pytest`` deselects it; run it with
``pytest -m real_model tests/real_model``. When the model or its server is not installed, every
test of the suite fails (never skips) with a one-line message saying how to install them
(``bash .ci/real_model.sh``). A failing test shows the tail of each server's log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop.testing.real_model import LlamaServer, RealModel, RealModelMissing, locate

_SERVERS: list[LlamaServer] = []


@pytest.fixture(scope="session")
def real_model() -> RealModel:
    try:
        return locate()
    except RealModelMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-server-logs")


def _serve(model: RealModel, logs: Path, name: str, **settings: Any) -> Iterator[LlamaServer]:
    server = LlamaServer(model, log_path=logs / f"{name}.log", **settings)
    _SERVERS.append(server)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tool_server(real_model: RealModel, server_logs: Path) -> Iterator[LlamaServer]:
    """Native tool calls (``chatml-function-calling``), a 2048-token window."""
    yield from _serve(real_model, server_logs, "tools", n_ctx=2048)


@pytest.fixture(scope="module")
def small_server(real_model: RealModel, server_logs: Path) -> Iterator[LlamaServer]:
    """A 256-token window: a longer prompt gets the server's own context-length error."""
    yield from _serve(real_model, server_logs, "small-ctx", n_ctx=256)


@pytest.fixture(scope="module")
def text_server(real_model: RealModel, server_logs: Path) -> Iterator[LlamaServer]:
    """Gemma's own turn format (``<start_of_turn>user``...; this GGUF carries no chat template,
    and llama-cpp-python's fallback for that is Llama 2's), no tool support: text only. It
    drops system messages, as Gemma's template does."""
    yield from _serve(real_model, server_logs, "text", n_ctx=2048, chat_format="gemma")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.path.is_relative_to(Path(__file__).parent):
        for server in _SERVERS:
            report.sections.append(
                (f"llama server log {server.log_path} (last lines)", server.log_tail(30))
            )
