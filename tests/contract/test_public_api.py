"""The public names downstream code imports (issue: keep them), and no import side effects."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import polyloop
import polyloop.journal
import polyloop.testing

PUBLIC = {
    "Loop",
    "Limits",
    "StopReason",
    "ActionStatus",
    "StepRecord",
    "RunResult",
    "ToolRegistry",
    "ToolContext",
    "ToolCall",
    "ModelRequest",
    "ModelReply",
    "Outcome",
    "Action",
    "FinalAnswer",
    "InvalidDecision",
    "ModelCallError",
    "EnvironmentFailure",
    "RunExists",
}


def test_the_promised_public_names_are_exported() -> None:
    assert set(polyloop.__all__) >= PUBLIC
    for name in polyloop.__all__:
        assert getattr(polyloop, name) is not None
    assert {"ScriptedModel", "FunctionModel"} <= set(polyloop.testing.__all__)
    assert "MemoryJournal" in polyloop.journal.__all__


def test_all_is_pinned() -> None:
    # A change here is a change of the public surface: make it on purpose.
    assert sorted(polyloop.__all__) == sorted(
        PUBLIC
        | {
            "DEFAULT_TEMPLATES",
            "AlreadyDecided",
            "ApprovalRequired",
            "NotAwaitingApproval",
            "Complete",
            "ConfigError",
            "Escalate",
            "EscalationReport",
            "GuardContext",
            "RunEndGuard",
            "Steer",
            "Failure",
            "FallbackModel",
            "Pricing",
            "FileEdit",
            "JournalError",
            "LeaseLost",
            "MalformedValue",
            "OutcomeUnknown",
            "PendingAction",
            "PolyLoopError",
            "ReplayPolicy",
            "RetryPolicy",
            "RunDetached",
            "RunLeased",
            "RunNotFound",
            "SystemClock",
            "Templates",
            "ToolEnvironment",
            "Usage",
        }
    )


def test_importing_polyloop_prints_nothing_and_writes_nothing(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import os, polyloop; print(sorted(os.listdir('.')))"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        check=True,
    )
    assert out.stdout.strip() == "[]" and out.stderr == ""


def test_the_kernel_imports_only_types_seams_and_the_standard_library() -> None:
    kernel = Path(polyloop.__file__).parent / "kernel"
    for path in kernel.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                target = "." * node.level + (node.module or "")
                assert node.level == 1 or target in ("..types", "..seams"), (path.name, target)
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                for name in names:
                    top = (name or "").split(".")[0]
                    assert top in sys.stdlib_module_names or top == "__future__", (path.name, name)


async def test_the_wording_version_of_a_run_is_stored_with_it(tmp_path: Path) -> None:
    from polyloop import DEFAULT_TEMPLATES, Loop
    from polyloop.tools.builtin import DEFAULT_BUILTIN_TEXTS, workspace_tools

    journal = polyloop.journal.MemoryJournal()
    model = polyloop.testing.ScriptedModel(["done"])
    await Loop(model, tools=workspace_tools(tmp_path, shell=False), journal=journal).run(
        "g", run_id="w"
    )
    spec, _ = await journal.read("w")
    assert spec.wording_version == f"{DEFAULT_TEMPLATES.version}+{DEFAULT_BUILTIN_TEXTS.version}"
    await Loop(polyloop.testing.ScriptedModel(["x"]), journal=journal).run("g", run_id="v")
    spec, _ = await journal.read("v")
    assert spec.wording_version == DEFAULT_TEMPLATES.version
