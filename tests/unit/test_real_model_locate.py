"""``polyloop.testing.real_model``: finding the local model and its server, and a server that
cannot start (no model needed: these run in the default suite)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polyloop.testing.real_model import GGUF_NAME, LlamaServer, RealModel, RealModelMissing, locate


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("POLYLOOP_REAL_MODEL_PY", raising=False)
    monkeypatch.delenv("POLYLOOP_REAL_MODEL_GGUF", raising=False)
    monkeypatch.setenv("POLYLOOP_CACHE", str(tmp_path))
    return tmp_path


def test_nothing_installed_is_one_line_naming_the_path_and_the_install_command(
    cache: Path,
) -> None:
    with pytest.raises(RealModelMissing) as caught:
        locate()
    message = str(caught.value)
    assert "\n" not in message
    assert str(cache / "real-model-venv" / "bin" / "python") in message
    assert "bash .ci/real_model.sh" in message


def test_the_cache_install_is_found_and_the_environment_overrides_it(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    python = cache / "real-model-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    with pytest.raises(RealModelMissing, match="model is not installed"):
        locate()  # the server's Python alone is not enough
    (cache / GGUF_NAME).write_bytes(b"")
    assert locate() == RealModel(python=python, gguf=cache / GGUF_NAME)

    other = tmp_path / "other.gguf"
    other.write_bytes(b"")
    monkeypatch.setenv("POLYLOOP_REAL_MODEL_GGUF", str(other))
    assert locate().gguf == other


def test_a_server_that_exits_at_once_is_an_error_naming_its_log(tmp_path: Path) -> None:
    # A real Python without llama_cpp: `python -m llama_cpp.server` fails at once.
    model = RealModel(python=Path(sys.executable), gguf=tmp_path / GGUF_NAME)
    server = LlamaServer(model, log_path=tmp_path / "server.log", startup_timeout_s=60)
    with pytest.raises(RuntimeError, match=r"exited with code 1; see .*server\.log"):
        server.start()
    assert server.pid is None
    assert "No module named 'llama_cpp'" in server.log_tail()
