"""The exit codes of the ``polyloop`` command: one table, read by the commands, by
``polyloop --help`` and by the README (a test checks that the README lists exactly these)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["EXIT_BY_REASON", "MEANINGS", "ExitCode", "epilog", "exit_code"]


class ExitCode(IntEnum):
    """Every code the command exits with."""

    OK = 0
    BAD_INPUT = 1
    USAGE = 2
    BUDGET = 3
    ERROR_STOP = 4
    NEEDS_HUMAN = 5
    UNKNOWN_REASON = 6
    NOT_ALL_ENDED = 7
    DAMAGED = 8
    INTERRUPTED = 130


MEANINGS: dict[ExitCode, str] = {  # one line each in ``--help``: at most 70 characters
    ExitCode.OK: "ended task_completed or agent_finished (batch, recover: all ended)",
    ExitCode.BAD_INPUT: "bad input: one line on stderr saying what to fix, no traceback",
    ExitCode.USAGE: "usage error: unknown command or option, missing or unknown value",
    ExitCode.BUDGET: "a budget stop: step/action/token/cost/time_budget, context_overflow",
    ExitCode.ERROR_STOP: "an error stop: llm_error, env_error, parse_failed_repeatedly",
    ExitCode.NEEDS_HUMAN: "needs a human: resume_state_unknown/repeated_failure/escalated/parked",
    ExitCode.UNKNOWN_REASON: "a stop reason this version does not know",
    ExitCode.NOT_ALL_ENDED: "batch, recover: some runs did not end (listed; re-run to go on)",
    ExitCode.DAMAGED: "the journal file is damaged: found by check, or before a write",
    ExitCode.INTERRUPTED: "cancelled, stopped or detached (Ctrl-C, polyloop stop/cancel)",
}

EXIT_BY_REASON: dict[str, ExitCode] = {
    "task_completed": ExitCode.OK,
    "agent_finished": ExitCode.OK,
    "step_budget": ExitCode.BUDGET,
    "action_budget": ExitCode.BUDGET,
    "context_overflow": ExitCode.BUDGET,
    "token_budget": ExitCode.BUDGET,
    "cost_budget": ExitCode.BUDGET,
    "time_budget": ExitCode.BUDGET,
    "llm_error": ExitCode.ERROR_STOP,
    "env_error": ExitCode.ERROR_STOP,
    "parse_failed_repeatedly": ExitCode.ERROR_STOP,
    "resume_state_unknown": ExitCode.NEEDS_HUMAN,
    "repeated_failure": ExitCode.NEEDS_HUMAN,
    "escalated": ExitCode.NEEDS_HUMAN,
    "cancelled": ExitCode.INTERRUPTED,
    "stopped": ExitCode.INTERRUPTED,
}


def exit_code(stop_reason: str) -> int:
    """The process exit code for a stop reason (``UNKNOWN_REASON`` for one this version does
    not know)."""
    return int(EXIT_BY_REASON.get(str(stop_reason), ExitCode.UNKNOWN_REASON))


def epilog() -> str:
    """The exit-code table that ``polyloop --help`` ends with (``\\b``: lines kept as written)."""
    rows = "\n".join(f"  {int(code):>3}  {MEANINGS[code]}" for code in ExitCode)
    return f"Exit codes:\n\n\b\n{rows}"
