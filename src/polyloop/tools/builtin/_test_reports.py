"""``extract_failures``: the failures in a pytest or unittest report, as stable fields.

The failure guard (kernel.md §10) compares failures by fingerprint, and a fingerprint is only
as good as the fields it is made of: the failing check (the test id with its path), the error
type, the top frame (``file:line``) and the key message. This module reads them from the text
a test run printed, with nothing else to go on: it is pure (no I/O, no clock, no environment),
and it never raises on odd input (a line it cannot read is skipped).

What it recognises (a reader per format, :mod:`._pytest_report` and :mod:`._unittest_report`;
this module makes their entries into failures):

* **pytest**, in every report style: ``-q`` and verbose (``-v``), ``--tb=long`` (the
  default), ``short``, ``line``, ``native`` and ``no``; the ``FAILURES`` and ``ERRORS``
  sections (errors at setup and teardown, collection errors), the "short test summary info"
  lines ``FAILED path::test - message`` / ``ERROR path::test``, the verbose progress lines and
  the final counts line.
* **unittest**: the ``FAIL: name (id)`` / ``ERROR: name (id)`` blocks with their tracebacks
  (subtests and docstrings included), ``Ran N tests in …`` and ``OK`` / ``FAILED (…)``.

How the fields are read:

* ``check``: pytest's node id (``tests/test_x.py::TestC::test_y[param]``; a collection error is
  the file's node id); unittest's dotted id (``tests.test_orders.CancelOrderTest.test_x``, with
  a subtest's parameters after it; a module that failed to import is its module name).
* ``error_type``: the exception's class name without its module (``AssertionError``,
  ``KeyError``, ``OrderError``), so that every report style names it alike.
* ``top_frame``: the innermost frame of the (last, when chained) traceback that is not in the
  test framework, the standard library or site-packages, preferring the code under test over
  test files; paths under the project root are made relative to it (the root is taken from
  pytest's ``rootdir:`` line, or found by matching the test's own path), so that the same
  failure in another checkout or temporary directory reads the same.
* ``message``: the first line of the exception message (for a bare ``assert``, pytest's
  ``assert 1 == 2``), at most 200 characters, with the project root removed from paths.

A report holding less gives fewer fields: ``--tb=no`` shows no frames, and pytest cuts summary
lines to the terminal width; ``--tb=line`` shows one crash line per failure, which for
unittest's assertions lies inside unittest (no top frame then). The same failure read from two
styles can therefore differ; from two runs in one style it reads the same.

Order: failed tests first, then errors (at setup or teardown, collecting, importing), each in
the order of the report, for both frameworks (unittest prints its errors first); the first is
the report's ``representative``. Timings, addresses and temporary paths that remain in a
message are :meth:`Failure.fingerprint`'s to normalise; nothing here depends on them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from polyloop.types import Failure

from ._pytest_report import read_pytest
from ._report_parts import FRAMEWORK, Found, Read
from ._unittest_report import read_unittest

__all__ = ["TestReport", "extract_failures"]

_MAX_MESSAGE = 200
_MAX_LINE = 4000  # characters of a line that are read: the rest is never a field's
_MAX_ROOTS = 8  # a report has one project root, two at most; odd input may suggest many

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test|tests|conftest)\.py$")


@dataclass(frozen=True, slots=True)
class TestReport:
    """The failures a test run reported.

    Attributes:
        framework: ``"pytest"`` or ``"unittest"``.
        failures: one :class:`Failure` per failing test: failed tests first, then errors
            (setup, teardown, collection, import), each in the order the report shows them.
            Empty when the report shows none (all tests passed, or none ran).
        summary: the report's closing line as printed (``6 failed, 1 passed in 0.12s``;
            ``Ran 5 tests in 0.001s: FAILED (failures=2, errors=2)``), "" if it was not in
            the output. For people: it holds a timing, so it is no part of any fingerprint.
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, despite its name

    framework: Literal["pytest", "unittest"]
    failures: tuple[Failure, ...] = ()
    summary: str = ""

    @property
    def representative(self) -> Failure | None:
        """The first failure: the one the failure guard counts; None when there is none."""
        return self.failures[0] if self.failures else None


def extract_failures(output: str) -> TestReport | None:
    """Read the failures from a pytest or unittest report.

    Args:
        output: what the test run printed (stdout and stderr, as the shell tool shows it;
            colour codes and CRLF line ends are fine). Of output cut in the middle, a failure
            whose traceback was cut away is read from its summary line (its id, and the type
            and message if pytest printed them there); the shell tool marks its cut with a
            section line so that the two halves are not read as one entry.

    Returns:
        A :class:`TestReport` (with no failures if the tests passed), or None when the output
        is not a pytest or unittest report. When both appear, a report with failures wins,
        pytest first.

    Never raises on odd input; reads nothing but ``output``.
    """
    text = _ANSI.sub("", output).replace("\r\n", "\n").replace("\r", "\n")
    lines = [line[:_MAX_LINE] for line in text.split("\n")]
    pytest = _report("pytest", read_pytest(lines))
    if pytest is not None and pytest.failures:
        return pytest
    unit = _report("unittest", read_unittest(lines))
    if unit is not None and unit.failures:
        return unit
    return pytest if pytest is not None else unit


def _report(framework: Literal["pytest", "unittest"], read: Read | None) -> TestReport | None:
    """The report of what a reader found (None: the output is no report of its framework):
    failed tests first, then errors, each in the order read."""
    if read is None:
        return None
    roots = _roots(read.found, read.roots)
    ordered = [f for f in read.found if f.failed] + [f for f in read.found if not f.failed]
    return TestReport(framework, tuple(_failure(f, roots) for f in ordered), read.summary)


def _roots(found: Sequence[Found], declared: Sequence[str]) -> list[str]:
    """Project roots: the declared ones, and those that put a test's own file at the end of an
    absolute frame path (``/tmp/x/tests/test_a.py`` and ``tests/test_a.py`` give ``/tmp/x``)."""
    roots: Counter[str] = Counter(r.rstrip("/") for r in declared if r.strip("/"))
    for item in found:
        if not item.test_file:
            continue
        suffix = "/" + item.test_file.lstrip("/")
        for path in [*(f.path for f in item.frames), *item.paths]:
            if path.startswith("/") and path.endswith(suffix) and len(path) > len(suffix):
                roots[path[: -len(suffix)]] += 1
    common = [root for root, _ in roots.most_common(_MAX_ROOTS)]
    return sorted(common, key=len, reverse=True)


def _relative(path: str, roots: Sequence[str]) -> str:
    for root in roots:
        if path.startswith(root + "/"):
            return path[len(root) + 1 :]
    return path


def _unrooted(text: str, roots: Sequence[str]) -> str:
    for root in roots:
        text = text.replace(root + "/", "")
    return text


def _top_frame(item: Found, roots: Sequence[str]) -> str | None:
    """The innermost frame outside the framework, preferring one outside the test files."""
    ours = [
        (_relative(f.path, roots), f.line)
        for f in item.frames
        if not FRAMEWORK.search(f.path.replace("\\", "/"))
    ]
    if not ours:
        return None
    own = (item.test_file or "").lstrip("/")

    def is_test(path: str) -> bool:
        norm = path.replace("\\", "/")
        return bool(_TEST_FILE.search(norm)) or bool(own and norm.endswith(own))

    code = [frame for frame in ours if not is_test(frame[0])]
    path, line = (code or ours)[-1]
    return f"{path}:{line}"


def _failure(item: Found, roots: Sequence[str]) -> Failure:
    message = item.message
    if message is not None:
        message = _unrooted(message.strip(), roots)[:_MAX_MESSAGE].rstrip() or None
    return Failure(
        check=item.check,
        error_type=item.error_type,
        top_frame=_top_frame(item, roots),
        message=message,
    )
