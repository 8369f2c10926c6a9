"""The unittest reader of :func:`~._test_reports.extract_failures`, for the blocks it lists."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._report_parts import Found, Frame, Read, python_traceback, split_exception

__all__ = ["read_unittest"]

_UT_SEP = re.compile(r"^={20,}$")
_UT_DASH = re.compile(r"^-{20,}$")
_UT_HEAD = re.compile(r"^(?P<kind>FAIL|ERROR): (?P<title>.*\S)\s*$")
_UT_TITLE = re.compile(r"^(?P<name>\S+) \((?P<id>[^()\s]+)\)(?P<rest>.*)$")
_UT_RAN = re.compile(r"^Ran \d+ tests? in \d+(?:\.\d+)?s$")
_UT_STATUS = re.compile(r"^(?:OK|FAILED)(?: \(.*\))?$")


def read_unittest(lines: Sequence[str]) -> Read | None:
    """The entries of a unittest report in ``lines``; None when they hold no unittest report."""
    recognised = False
    found: list[Found] = []
    ran = ""
    status = ""
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if _UT_RAN.match(line):
            recognised = True
            ran = line
            for after in lines[i + 1 : i + 4]:
                if _UT_STATUS.match(after.strip()):
                    status = after.strip()
                    break
            i += 1
            continue
        head = _UT_HEAD.match(lines[i + 1]) if i + 1 < n and _UT_SEP.match(line) else None
        if head is None:
            i += 1
            continue
        recognised = True
        j = i + 2
        while j < n and not _UT_DASH.match(lines[j]) and not _UT_SEP.match(lines[j]):
            j += 1  # the docstring's first line may come between the title and the dashes
        j += 1 if j < n and _UT_DASH.match(lines[j]) else 0
        k = j
        while k < n and not _UT_SEP.match(lines[k]) and not _UT_DASH.match(lines[k]):
            k += 1
        found.append(_unittest_block(head["kind"] == "FAIL", head["title"], lines[j:k]))
        i = k
    if not recognised:
        return None
    summary = f"{ran}: {status}" if ran and status else ran or status
    return Read(found, summary)


def _unittest_block(failed: bool, title: str, body: Sequence[str]) -> Found:
    parsed = _UT_TITLE.match(title)
    if parsed is None:
        check = title
    else:
        name, test_id, rest = parsed["name"], parsed["id"], parsed["rest"].strip()
        if test_id.startswith("unittest.loader._Failed"):  # a module that failed to import
            check = name
        elif test_id == name or test_id.endswith("." + name):
            check = test_id
        else:
            check = f"{test_id}.{name}"
        if rest:
            check = f"{check} {rest}"  # a subtest's parameters: "(i=1)"
    frames, exception = python_traceback(body)
    error_type: str | None = None
    message: str | None = None
    if exception is not None:
        error_type, message = split_exception(exception, strict=False)
    else:  # no traceback: the first line of the block is all there is
        first = next((line.strip() for line in body if line.strip()), "")
        if first:
            error_type, message = split_exception(first, strict=True)
    return Found(
        check=check,
        failed=failed,
        frames=frames,
        error_type=error_type,
        message=message,
        test_file=_module_file(check, frames),
    )


def _module_file(check: str, frames: Sequence[Frame]) -> str | None:
    """The test's own file, relative to the project root: the longest dotted prefix of the id
    that names a frame's file (``tests.test_a.C.test_x`` and ``/r/tests/test_a.py`` →
    ``tests/test_a.py``)."""
    parts = check.split(" ", 1)[0].split(".")
    for k in range(len(parts), 0, -1):
        for suffix in ("/".join(parts[:k]) + ".py", "/".join(parts[:k]) + "/__init__.py"):
            if any(f.path == suffix or f.path.endswith("/" + suffix) for f in frames):
                return suffix
    return None
