"""Which files are test files, and what an edit did to the tests in one.

Deleting a test, deleting or loosening an assertion, or adding a skip marker can turn a red
test run green without fixing anything. The workspace tools report every edit of a test file
(:class:`~polyloop.types.FileEdit` with ``test_file=True``), and name what they can see it do,
by comparing the lines the edit replaced with the lines that replaced them:

* ``test_deleted``: a test function (``def test_…``; ``it(…)``/``test(…)`` in JavaScript and
  Ruby specs) that was there is gone;
* ``assertion_deleted``: fewer assertion lines than before (``assert``, ``self.assert…``,
  ``expect(``, ``pytest.raises``, ``.should``); a commented-out assertion is a deleted one;
* ``assertion_changed``: an assertion line was rewritten. Whether it got looser or stricter is
  not something text can tell, so every rewrite is named for a person to read;
* ``skip_added``: more skip or expected-failure markers than before (``@pytest.mark.skip``,
  ``xfail``, ``@unittest.skip…``, ``self.skipTest``, ``pytest.skip(``, ``it.skip(``, ``xit(``).

This is a reading of text, not of syntax: it is pure, never raises, and costs one pass over
the lines compared. It errs towards naming too much (a person reads the flag), never towards
hiding an edit: every edit of a test file is flagged, with or without a sign.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Sequence

from polyloop.types import ConfigError, FileEdit

from ._paths import glob_regex

__all__ = ["DEFAULT_TEST_PATHS", "TestPaths", "edited_lines"]

DEFAULT_TEST_PATHS = ("tests/**", "test_*.py", "*_test.py", "*_spec.*")
"""The globs of test files by default: anything under a top-level ``tests`` folder, and files
named like pytest's and RSpec's/Jest's test files anywhere."""

_TEST_DEF = re.compile(
    r"^\s*(?:async\s+)?def\s+(test\w*)\s*\("  # Python
    r"|^\s*(?:it|test|specify)\s*\(\s*(['\"`])(.*?)\2"  # JavaScript / Ruby specs
)
_ASSERTION = re.compile(
    r"\bassert\w*\b|\bexpect\s*\(|\.should\b|\bpytest\.raises\b|\bassertThat\b|\bverify\s*\("
)
_SKIP = re.compile(
    r"@pytest\.mark\.(?:skip|skipif|xfail)\b|\bpytest\.(?:skip|xfail|importorskip)\s*\("
    r"|@unittest\.(?:skip\w*|expectedFailure)\b|@(?:skip|skipIf|skipUnless|expectedFailure)\b"
    r"|\bself\.skipTest\s*\(|\braise\s+(?:unittest\.)?SkipTest\b"
    r"|\b(?:it|test|describe)\.(?:skip|todo)\s*\(|\bx(?:it|describe|test)\s*\("
)
_COMMENT = ("#", "//")


class TestPaths:
    """The globs that make a path a test file.

    A glob with "/" is matched against the path relative to the workspace root (``tests/**``:
    anything under the top-level ``tests`` folder); one without "/" against the file name, in
    any folder (``test_*.py``). ``*`` and ``?`` never match "/", ``**`` any number of folders.

    Raises:
        ConfigError: ``globs`` is a single string, or holds an empty entry.
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, globs: Sequence[str]) -> None:
        if isinstance(globs, str):
            raise ConfigError(
                f"workspace_tools: test_paths must be a list of globs, got the single glob "
                f"{globs!r}; write test_paths=[...]"
            )
        entries = list(globs)
        for glob in entries:
            if not isinstance(glob, str) or not glob or "\x00" in glob:
                raise ConfigError(
                    f"workspace_tools: test_paths entry {glob!r} must be a non-empty glob"
                )
        self.globs = tuple(entries)
        self._by_path = [glob_regex(g) for g in entries if "/" in g]
        self._by_name = [glob_regex(g) for g in entries if "/" not in g]

    def __contains__(self, rel: object) -> bool:
        """Is ``rel`` (a path relative to the root, "/"-separated) a test file?"""
        if not isinstance(rel, str):
            return False
        name = posixpath.basename(rel)
        return any(rx.fullmatch(rel) for rx in self._by_path) or any(
            rx.fullmatch(name) for rx in self._by_name
        )

    def edit(self, rel: str, before: str, after: str) -> FileEdit:
        """The :class:`FileEdit` of a change of ``rel`` from ``before`` to ``after`` (the
        lines the edit replaced and their replacement, or whole files); its signs only when
        ``rel`` is a test file."""
        if rel not in self:
            return FileEdit(rel)
        return FileEdit(rel, True, tampering(before, after))


def _code_lines(text: str) -> list[str]:
    """The lines of ``text`` that are not comments, stripped and with runs of blanks as one."""
    lines = []
    for line in text.splitlines():
        stripped = " ".join(line.split())
        if stripped and not stripped.startswith(_COMMENT):
            lines.append(stripped)
    return lines


def tampering(before: str, after: str) -> tuple[str, ...]:
    """The signs (:data:`~polyloop.types.TAMPERING_SIGNS`, in their order) of what changing
    ``before`` into ``after`` did to the tests in them."""
    old, new = _code_lines(before), _code_lines(after)
    signs = []
    if _tests(old) - _tests(new):
        signs.append("test_deleted")
    removed = _assertions(old) - _assertions(new)
    added = _assertions(new) - _assertions(old)
    if removed.total() > added.total():
        signs.append("assertion_deleted")
    if removed and added:
        signs.append("assertion_changed")
    if _skips(new) > _skips(old):
        signs.append("skip_added")
    return tuple(signs)


def _tests(lines: list[str]) -> Counter[str]:
    names: Counter[str] = Counter()
    for line in lines:
        m = _TEST_DEF.match(line)
        if m is not None:
            names[m.group(1) or m.group(3)] += 1
    return names


def _assertions(lines: list[str]) -> Counter[str]:
    return Counter(line for line in lines if _ASSERTION.search(line))


def _skips(lines: list[str]) -> int:
    return sum(len(_SKIP.findall(line)) for line in lines)


def edited_lines(text: str, start: int, end: int) -> tuple[int, int]:
    """The span of the whole lines of ``text`` that hold ``text[start:end]``."""
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", end)
    return first, len(text) if last == -1 else last
