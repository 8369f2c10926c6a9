"""The code-block interpreter: the first fenced code block is the action, the code itself."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from polyloop.types import (
    DEFAULT_TEMPLATES,
    Action,
    ConfigError,
    Decision,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    Templates,
    ToolSpec,
)

__all__ = ["CodeBlockInterpreter"]

# A regular expression (a str is compiled with re.MULTILINE | re.DOTALL), or a function of the
# reply text returning the answer or None.
_FinalForm: TypeAlias = str | re.Pattern[str] | Callable[[str], str | None]

_DEFAULT_FINAL = r"^FINAL ANSWER:\s*(.+)$"
_OPEN = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_CLOSE = re.compile(r"^ *(?P<ticks>`{3,})[ \t]*$")


@dataclass(frozen=True, slots=True)
class _Block:
    """One closed fenced block: its info string's first word, its content, its span."""

    language: str
    code: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Fences:
    """The closed fenced blocks of a text, in order, and the language of the unclosed fence
    that ends it (None when every fence is closed)."""

    blocks: tuple[_Block, ...]
    unclosed: str | None


def _line_body(line: str) -> str:
    return line.rstrip("\r\n")


def _fences(text: str) -> _Fences:
    """Find the fenced code blocks of ``text`` (Markdown, backtick fences only).

    A fence opens on a line of three or more backticks plus an optional info string (its first
    word is the language) and closes on a later line of at least as many backticks and nothing
    else. Fences may be indented; up to that many leading spaces are removed from the content
    lines. The content keeps its line endings except the last one. An opening fence that is
    never closed is not a block (it is reported in ``unclosed``, and, as in Markdown, nothing
    after it is a fence): a reply cut off mid-block must not run half a program.
    """
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    blocks: list[_Block] = []
    unclosed: str | None = None
    i = 0
    while i < len(lines):
        opening = _OPEN.match(_line_body(lines[i]))
        if opening is None:
            i += 1
            continue
        ticks = len(opening["ticks"])
        close = next(
            (
                j
                for j in range(i + 1, len(lines))
                if (m := _CLOSE.match(_line_body(lines[j]))) and len(m["ticks"]) >= ticks
            ),
            None,
        )
        info = opening["info"].split()
        language = info[0] if info else ""
        if close is None:
            unclosed = language  # as in Markdown, it runs to the end: nothing after is a fence
            break
        indent = len(opening["indent"])
        content = "".join(_dedent(line, indent) for line in lines[i + 1 : close])
        if content.endswith("\r\n"):
            content = content[:-2]
        elif content.endswith(("\n", "\r")):
            content = content[:-1]
        blocks.append(_Block(language, content, offsets[i], offsets[close + 1]))
        i = close + 1
    return _Fences(tuple(blocks), unclosed)


def _dedent(line: str, indent: int) -> str:
    stripped = line.lstrip(" ")
    return line[min(indent, len(line) - len(stripped)) :]


def _compile_final(final: _FinalForm | None) -> Callable[[str], str | None] | None:
    if final is None or callable(final):
        return final
    if isinstance(final, str):
        try:
            pattern = re.compile(final, re.MULTILINE | re.DOTALL)
        except re.error as exc:
            raise ConfigError(
                f"final_pattern {final!r} is not a valid regular expression: {exc}"
            ) from exc
    elif isinstance(final, re.Pattern):
        pattern = final
    else:
        raise ConfigError(
            "final_pattern must be a regular expression (str or re.Pattern), a function "
            f"(reply text) -> answer or None, or None; got {type(final).__name__}"
        )

    def search(text: str) -> str | None:
        match = pattern.search(text)
        if match is None:
            return None
        return match.group(1) if pattern.groups else match.group(0)

    return search


class CodeBlockInterpreter:
    """Reads a fenced code block from the reply text (the Interpreter seam). Pure and
    deterministic.

    In order:

    * Native tool calls in the reply -> ``InvalidDecision``
      (``templates.code_block_native_tool_calls``): code is read from the text only, and none of
      the calls is executed.
    * The first closed fenced code block that counts (with ``language`` set, only blocks whose
      info string's first word matches it, case-insensitively; else every block) is the action:
      ``Action(text=<the code exactly>)``, ``tool_name``/``arguments``/``call_id`` None. Later
      blocks are ignored. With ``submit_marker`` set, a block whose first line is the marker
      (surrounding whitespace ignored) is a ``FinalAnswer`` of the block's remaining lines
      (stripped; "" when there are none) instead. A blank block -> ``InvalidDecision``
      (``templates.code_block_empty``).
    * Else the final-answer form -> ``FinalAnswer`` (the answer stripped of surrounding
      whitespace; a blank answer does not count). The default is a line starting with
      ``FINAL ANSWER:``, the answer being everything after it to the end of the reply.
    * Else ``InvalidDecision``: ``templates.code_block_wrong_language`` when blocks exist but
      none in ``language``; ``templates.code_block_unclosed`` when a block was opened and never
      closed (e.g. a reply cut off); otherwise ``templates.code_block_missing`` (also for an
      empty reply).

    **A code block wins over a final-answer line** in the same reply: the code runs and the
    final line is ignored, because what the code does to the environment is the ground truth a
    final answer should be judged against. The model can answer on its next turn.

    Fences are Markdown backtick fences (three or more backticks) at the start of a line,
    possibly indented, closed by a line of at least as many backticks. Every feedback ends with
    the expected form (:attr:`instructions`).

    Args:
        templates: the wording of the feedback. If you change ``final_pattern`` or
            ``submit_marker``, describe the new form in ``templates.code_block_final_line``.
        language: the info string a block must carry to count, e.g. ``"python"`` (or several,
            e.g. ``("python", "py")``); None counts every block.
        final_pattern: the final-answer form: a regular expression (a ``str`` is compiled with
            ``re.MULTILINE | re.DOTALL``; group 1, or the whole match if it has no group, is the
            answer) or a function ``(reply text) -> answer | None``; None disables the text
            final answer (the run then ends through the environment or ``submit_marker``).
        submit_marker: a first line that turns a code block into a final answer, or None.

    Raises:
        ConfigError: ``final_pattern`` is not a valid regular expression or function, or
            ``language``/``submit_marker`` is blank.
    """

    def __init__(
        self,
        *,
        templates: Templates = DEFAULT_TEMPLATES,
        language: str | Collection[str] | None = None,
        final_pattern: _FinalForm | None = _DEFAULT_FINAL,
        submit_marker: str | None = None,
    ) -> None:
        if isinstance(language, str):
            language = (language,)
        if language is not None and (not language or any(not n.strip() for n in language)):
            raise ConfigError(f"language must be a non-empty name or None, got {language!r}")
        if submit_marker is not None and not submit_marker.strip():
            raise ConfigError("submit_marker must be a non-blank line or None")
        self._templates = templates
        self._languages = None if language is None else tuple(n.strip() for n in language)
        self._accepted = (
            None if self._languages is None else frozenset(n.lower() for n in self._languages)
        )
        self._final_pattern = final_pattern
        self._final = _compile_final(final_pattern)
        self._submit_marker = None if submit_marker is None else submit_marker.strip()
        self._fence = "```" + (self._languages[0] if self._languages else "")

    @property
    def instructions(self) -> str:
        """The expected form in words (``templates.code_block_expected``), as every feedback
        ends with it; suitable for a system prompt."""
        t = self._templates
        final = t.code_block_final_line if self._final is not None else ""
        if self._submit_marker is not None:
            final += t.code_block_submit.format(marker=self._submit_marker)
        return t.code_block_expected.format(fence=self._fence, final=final)

    def interpret(self, reply: ModelReply, tool_specs: Sequence[ToolSpec]) -> Decision:
        """Turn ``reply`` into one decision (see the class docstring). ``tool_specs`` is not
        consulted."""
        t = self._templates
        if reply.tool_calls:
            names = ", ".join(repr(c.name) for c in reply.tool_calls)
            return self._invalid(t.code_block_native_tool_calls, names=names)
        fences = _fences(reply.text)
        block = next((b for b in fences.blocks if self._counts(b.language)), None)
        if block is not None:
            return self._block(block)
        if self._final is not None:
            answer = self._final(reply.text)
            if answer is not None and answer.strip():
                return FinalAnswer(answer.strip())
        if fences.blocks:
            found = ", ".join(dict.fromkeys("```" + b.language for b in fences.blocks))
            return self._invalid(t.code_block_wrong_language, fence=self._fence, found=found)
        if fences.unclosed is not None and self._counts(fences.unclosed):
            return self._invalid(t.code_block_unclosed)
        return self._invalid(t.code_block_missing)

    def _counts(self, language: str) -> bool:
        return self._accepted is None or language.lower() in self._accepted

    def _block(self, block: _Block) -> Decision:
        if not block.code.strip():
            return self._invalid(self._templates.code_block_empty)
        if self._submit_marker is not None:
            first, _, rest = block.code.strip().partition("\n")
            if first.strip() == self._submit_marker:
                return FinalAnswer(rest.strip())
        return Action(text=block.code)

    def _invalid(self, template: str, **values: str) -> InvalidDecision:
        return InvalidDecision(template.format(expected=self.instructions, **values))

    def __repr__(self) -> str:
        return (
            f"CodeBlockInterpreter(language={self._languages!r}, "
            f"final_pattern={self._final_pattern!r}, submit_marker={self._submit_marker!r})"
        )
