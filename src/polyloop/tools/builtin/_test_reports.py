"""``extract_failures``: the failures in a pytest or unittest report, as stable fields.

The failure guard (kernel.md §10) compares failures by fingerprint, and a fingerprint is only
as good as the fields it is made of: the failing check (the test id with its path), the error
type, the top frame (``file:line``) and the key message. This module reads them from the text
a test run printed, with nothing else to go on: it is pure (no I/O, no clock, no environment),
and it never raises on odd input (a line it cannot read is skipped).

What it recognises:

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

import itertools
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from polyloop.types import Failure

__all__ = ["TestReport", "extract_failures"]

_MAX_MESSAGE = 200
_MAX_LINE = 4000  # characters of a line that are read: the rest is never a field's
_MAX_ROOTS = 8  # a report has one project root, two at most; odd input may suggest many

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# --- pytest -------------------------------------------------------------------------------------
_PT_SECTION = re.compile(r"^=+ (.*?) =+$")
_PT_SESSION = "test session starts"
_PT_SUMMARY = "short test summary info"
_PT_HEAD = re.compile(r"^_+ (.+?) _+$")
_PT_SUBSECTION = re.compile(r"^-+ .+ -+$")  # "----- Captured stdout call -----"
_PT_ENTRY = re.compile(
    r"^(?P<kind>FAILED|ERROR|SUBFAILED\((?P<sub>.*?)\)) (?P<id>[^\s\[]+(?:\[.*?\])?)"
    r"(?: - (?P<msg>.*))?$"
)
_PT_PROGRESS = re.compile(r"^(?P<id>[^\s\[]+(?:\[.*?\])?) (FAILED|ERROR)(?: +\[ *\d+%\])?$")
# Matched against the line without its "=" decoration: "6 failed, 1 passed in 0.12s".
_PT_STATS = re.compile(
    r"^(?:(?:\d+ [a-z]+(?: [a-z]+)?, )*\d+ [a-z]+(?: [a-z]+)?|no tests ran) in \d+(?:\.\d+)?s\b"
)
_PT_ROOTDIR = re.compile(r"^rootdir: (.+?)(?:, (?:configfile|inifile|testpaths): .*)?$")
_PT_LOCATION = re.compile(r"^(?P<path>\S.*?):(?P<line>\d{1,9}):(?: (?P<rest>.*))?$")
_PT_FIXTURE_FILE = re.compile(r"^file (?P<path>.+), line (?P<line>\d{1,9})$")
_PT_SETUP_HEAD = re.compile(r"^ERROR at \w+ of (.+)$")
_PT_COLLECT_HEAD = re.compile(r"^ERROR collecting (.+)$")
_FIXTURE_NOT_FOUND = re.compile(r"^fixture '.*' not found$")
_PT_IMPORT_ERROR = re.compile(r"^ImportError while importing test module '(?P<path>.+)'\.$")

# --- Python tracebacks and unittest -------------------------------------------------------------
_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
_PY_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d{1,9})(?:, in .*)?$')
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_UT_SEP = re.compile(r"^={20,}$")
_UT_DASH = re.compile(r"^-{20,}$")
_UT_HEAD = re.compile(r"^(?P<kind>FAIL|ERROR): (?P<title>.*\S)\s*$")
_UT_TITLE = re.compile(r"^(?P<name>\S+) \((?P<id>[^()\s]+)\)(?P<rest>.*)$")
_UT_RAN = re.compile(r"^Ran \d+ tests? in \d+(?:\.\d+)?s$")
_UT_STATUS = re.compile(r"^(?:OK|FAILED)(?: \(.*\))?$")

# --- exceptions and frames ----------------------------------------------------------------------
# "KeyError: 'x'", "shop.orders.OrderError: boom", "AssertionError", "Failed: DID NOT RAISE"
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.<>]*)(?::(?: (?P<msg>.*))?)?$")
_FRAMEWORK = re.compile(
    r"(?:^|/)(?:site-packages|dist-packages|_pytest|pluggy|lib-python)/"
    r"|(?:^|/)lib(?:64)?/python\d[^/]*/"
    r"|^<"  # <frozen importlib._bootstrap>, <string>
)
_TEST_MODULE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test)\.py$")
_TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test|tests|conftest)\.py$")
_FILE_LIKE = re.compile(r"\.[A-Za-z]\w*$|^<.*>$")


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
    pytest = _pytest_report(lines)
    if pytest is not None and pytest.failures:
        return pytest
    unit = _unittest_report(lines)
    if unit is not None and unit.failures:
        return unit
    return pytest if pytest is not None else unit


# --- shared helpers -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Frame:
    path: str
    line: str


@dataclass(slots=True)
class _Found:
    """What one report entry says, before it becomes a Failure."""

    check: str
    failed: bool  # a failed test, as opposed to an error
    frames: list[_Frame] = field(default_factory=list)
    error_type: str | None = None
    message: str | None = None
    test_file: str | None = None  # the test's own file, as far as the check tells
    paths: list[str] = field(default_factory=list)  # other absolute paths of that file


def _split_exception(line: str, *, strict: bool) -> tuple[str | None, str]:
    """``(class name, message)`` of an exception line, or ``(None, line)``.

    ``strict``: only a capitalised class name counts (for lines that may be something else)."""
    line = line.strip()
    match = _EXCEPTION.match(line)
    if match is None:
        return None, line
    name = match["type"].rsplit(".", 1)[-1]
    if not name or (strict and not name[0].isupper()):
        return None, line
    return name, match["msg"] or ""


def _is_assertion(line: str) -> bool:
    return line == "assert" or line.startswith("assert ")


def _after_last_chain(lines: Sequence[str]) -> Sequence[str]:
    """The lines of the last exception of a chain (all of them when there is no chain)."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip() in _CHAINED:
            return lines[i + 1 :]
    return lines


def _python_traceback(lines: Sequence[str]) -> tuple[list[_Frame], str | None]:
    """The frames and the exception line of the last traceback in ``lines``."""
    lines = _after_last_chain(lines)
    start = -1
    for i in range(len(lines) - 1, -1, -1):
        if _TRACEBACK.match(lines[i]):
            start = i
            break
    frames: list[_Frame] = []
    last = start
    for i in range(start + 1, len(lines)):
        match = _PY_FRAME.match(lines[i])
        if match is not None:
            frames.append(_Frame(match["path"], match["line"]))
            last = i
    if start < 0 and not frames:
        return frames, None
    for line in lines[last + 1 :]:
        if line.strip() and not line[0].isspace():
            return frames, line
    return frames, None


def _roots(found: Sequence[_Found], declared: Sequence[str]) -> list[str]:
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


def _top_frame(item: _Found, roots: Sequence[str]) -> str | None:
    """The innermost frame outside the framework, preferring one outside the test files."""
    ours = [
        (_relative(f.path, roots), f.line)
        for f in item.frames
        if not _FRAMEWORK.search(f.path.replace("\\", "/"))
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


def _failure(item: _Found, roots: Sequence[str]) -> Failure:
    message = item.message
    if message is not None:
        message = _unrooted(message.strip(), roots)[:_MAX_MESSAGE].rstrip() or None
    return Failure(
        check=item.check,
        error_type=item.error_type,
        top_frame=_top_frame(item, roots),
        message=message,
    )


def _report(
    framework: Literal["pytest", "unittest"],
    found: list[_Found],
    summary: str,
    declared_roots: Sequence[str] = (),
) -> TestReport:
    roots = _roots(found, declared_roots)
    ordered = [f for f in found if f.failed] + [f for f in found if not f.failed]
    return TestReport(framework, tuple(_failure(f, roots) for f in ordered), summary)


# --- pytest -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Listed:
    """A node id the summary or a verbose progress line names as failed or errored."""

    nodeid: str
    failed: bool
    message: str | None
    used: bool = False


def _domain(nodeid: str) -> str:
    """What pytest's section header calls a node: ``tests/t.py::C::test_x[1]`` → ``C.test_x[1]``."""
    base, bracket, params = nodeid.partition("[")
    return ".".join(base.split("::")[1:]) + bracket + params


def _pytest_report(lines: Sequence[str]) -> TestReport | None:
    recognised = False
    section = ""
    stats = ""
    roots: list[str] = []
    listed: dict[tuple[str, bool], _Listed] = {}  # in the order first named
    blocks: list[tuple[bool, list[str]]] = []  # (in FAILURES, lines) of each section

    def listing(nodeid: str, failed: bool, message: str | None) -> None:
        known = listed.get((nodeid, failed))
        if known is None:
            listed[nodeid, failed] = _Listed(nodeid, failed, message)
        elif message and not known.message:  # a progress line named it before the summary
            known.message = message

    for line in lines:
        core = line.strip().strip("=").strip()
        if _PT_STATS.match(core):
            recognised = True
            stats = core
            section = ""
            continue
        head = _PT_SECTION.match(line)
        if head is not None:
            section = head.group(1).strip()
            if section in ("FAILURES", "ERRORS"):
                blocks.append((section == "FAILURES", []))
            if section in ("FAILURES", "ERRORS", _PT_SUMMARY, _PT_SESSION):
                recognised = True
            continue
        if section in ("FAILURES", "ERRORS"):
            blocks[-1][1].append(line)
            continue
        if section == _PT_SUMMARY:
            named = _PT_ENTRY.match(line)
            if named is not None:
                nodeid = named["id"]
                if named["sub"] is not None:  # a subtest: "SUBFAILED(i=1) path::test"
                    nodeid = f"{nodeid} ({named['sub']})"
                listing(nodeid, named["kind"] != "ERROR", named["msg"])
            continue
        progress = _PT_PROGRESS.match(line)
        if progress is not None and "::" in progress["id"]:
            listing(progress["id"], progress.group(2) == "FAILED", None)
            continue
        rootdir = _PT_ROOTDIR.match(line)
        if rootdir is not None:
            roots.append(rootdir.group(1).strip())
    if not recognised:
        return None
    names = _Names(list(listed.values()))
    found: list[_Found] = []
    for failed, block in blocks:
        found.extend(_pytest_block(block, failed, names))
    for entry in listed.values():
        if not entry.used:  # --tb=no, or a section the output cap cut away
            found.append(_from_summary(entry))
    return _report("pytest", found, stats, roots)


def _pytest_block(lines: list[str], failed: bool, names: _Names) -> list[_Found]:
    """The entries of one FAILURES or ERRORS section."""
    entries: list[tuple[str, list[str]]] = []
    loose: list[str] = []  # lines before any entry header: --tb=line puts everything there
    for line in lines:
        head = _PT_HEAD.match(line)
        if head is not None and set(head.group(1)) - {"_", " "}:
            entries.append((head.group(1), []))
        elif entries:
            entries[-1][1].append(line)
        else:
            loose.append(line)
    found = [_pytest_entry(title, body, failed, names) for title, body in entries]
    if not entries:
        found.extend(_pytest_crash_lines(loose, failed, names))
    return found


class _Names:
    """The listed nodes, found by what a section header calls them."""

    _PREFER = 16  # how many same-named candidates to try for the one in the entry's file

    def __init__(self, listed: list[_Listed]) -> None:
        self.listed = listed
        self._by_name: dict[tuple[bool, str], deque[_Listed]] = {}
        for entry in listed:
            for name in {_domain(entry.nodeid), entry.nodeid}:
                self._by_name.setdefault((entry.failed, name), deque()).append(entry)
        self._in_order = {
            failed: deque(e for e in listed if e.failed == failed) for failed in (True, False)
        }

    def claim(self, failed: bool, name: str, frames: list[_Frame]) -> _Listed | None:
        """The first unused node of this kind whose domain (or id) is ``name``; of the first
        few, one whose file is among the frames is preferred (two files can hold tests of the
        same name)."""
        queue = self._by_name.get((failed, name))
        if not queue:
            return None
        while queue and queue[0].used:
            queue.popleft()
        candidates = [e for e in itertools.islice(queue, self._PREFER) if not e.used]
        if not candidates:
            return None
        chosen = candidates[0]
        for candidate in candidates:
            own = candidate.nodeid.split("::", 1)[0]
            if any(f.path == own or f.path.endswith("/" + own) for f in frames):
                chosen = candidate
                break
        chosen.used = True
        return chosen

    def next_unused(self, failed: bool) -> _Listed | None:
        """The first unused node of this kind, in the order the report named them."""
        queue = self._in_order[failed]
        while queue and queue[0].used:
            queue.popleft()
        if not queue:
            return None
        entry = queue.popleft()
        entry.used = True
        return entry


def _pytest_entry(title: str, body: list[str], failed: bool, names: _Names) -> _Found:
    title = title.strip()
    collecting = _PT_COLLECT_HEAD.match(title)
    phase = _PT_SETUP_HEAD.match(title)
    domain = phase.group(1).strip() if phase else title
    frames, error_type, message, crash_type = _pytest_traceback(body)
    imported = (_PT_IMPORT_ERROR.match(line) for line in body[:3])
    paths = [match["path"] for match in imported if match is not None]
    if collecting is not None:
        nodeid = collecting.group(1).strip()
        entry = names.claim(failed, nodeid, frames)
    else:
        entry = names.claim(failed, domain, frames)
        if entry is not None:
            nodeid = entry.nodeid
        else:  # no summary names it (-rN): the test's file is the first test module framed
            base, bracket, params = domain.partition("[")
            ours = [f.path for f in frames if not _FRAMEWORK.search(f.path)]
            file = next((p for p in ours if _TEST_MODULE.search(p)), ours[0] if ours else None)
            name = base.replace(".", "::") + bracket + params
            nodeid = f"{file}::{name}" if file else name
    summary_type, summary_message = _summary_fields(entry.message if entry else None)
    if error_type is None:
        error_type = crash_type or summary_type
    if message is None:
        message = summary_message
    return _Found(
        check=nodeid,
        failed=failed,
        frames=frames,
        error_type=error_type,
        message=message,
        test_file=nodeid.split("::", 1)[0],
        paths=paths,
    )


def _pytest_traceback(
    body: list[str],
) -> tuple[list[_Frame], str | None, str | None, str | None]:
    """``(frames, error type, message, type named by the last location line)`` of one entry
    in any ``--tb`` style."""
    lines: list[str] = []
    for line in body:
        if "Captured" in line and _PT_SUBSECTION.match(line):
            break  # what the test printed follows: never read it as a traceback
        lines.append(line)
    lines = list(_after_last_chain(lines))
    frames: list[_Frame] = []
    groups: list[list[str]] = []
    crash_type: str | None = None
    previous_e = False
    for line in lines:
        if line.startswith("E") and (len(line) == 1 or line[1] == " "):
            content = line[1:].strip()
            framed = _PY_FRAME.match(content)
            if framed is not None:  # a SyntaxError's own location
                frames.append(_Frame(framed["path"], framed["line"]))
            if not previous_e:
                groups.append([])
            groups[-1].append(content)
            previous_e = True
            continue
        previous_e = False
        framed = _PY_FRAME.match(line) or _PT_FIXTURE_FILE.match(line)
        if framed is not None:
            frames.append(_Frame(framed["path"], framed["line"]))
            continue
        located = _PT_LOCATION.match(line)
        if located is not None and _looks_like_path(located["path"]):
            frames.append(_Frame(located["path"], located["line"]))
            rest = (located["rest"] or "").strip()
            crash_type = None
            if rest and not rest.startswith("in "):
                crash_type, _ = _split_exception(rest, strict=True)
    if groups:
        error_type, message = _e_group(groups[-1])
        return frames, error_type, message, crash_type
    if any(_TRACEBACK.match(line) for line in lines):  # --tb=native
        _, exception = _python_traceback(lines)
        if exception is not None:
            error_type, message = _split_exception(exception, strict=False)
            return frames, error_type, message, crash_type
    return frames, None, None, crash_type


def _looks_like_path(path: str) -> bool:
    return " = " not in path and bool(_FILE_LIKE.search(path))


def _e_group(group: list[str]) -> tuple[str | None, str | None]:
    """The error type and message of pytest's ``E`` lines."""
    first = next((line for line in group if line), "")
    if _is_assertion(first):
        return "AssertionError", first
    for line in group:
        error_type, message = _split_exception(line, strict=True)
        if error_type is not None:
            return error_type, message
    if _FIXTURE_NOT_FOUND.match(first):
        return "FixtureLookupError", first
    return None, first or None


def _summary_fields(message: str | None) -> tuple[str | None, str | None]:
    """Error type and message of a summary line's text (pytest may have cut it with "...")."""
    if not message:
        return None, None
    message = message.strip()
    if _is_assertion(message):
        return "AssertionError", message
    error_type, rest = _split_exception(message, strict=True)
    return error_type, rest


def _from_summary(entry: _Listed) -> _Found:
    entry.used = True
    error_type, message = _summary_fields(entry.message)
    return _Found(
        check=entry.nodeid,
        failed=entry.failed,
        error_type=error_type,
        message=message,
        test_file=entry.nodeid.split("::", 1)[0],
    )


def _pytest_crash_lines(lines: list[str], failed: bool, names: _Names) -> list[_Found]:
    """``--tb=line``: one ``path:line: message`` per entry, in the summary's order."""
    found: list[_Found] = []
    for line in lines:
        if line.startswith("E "):
            continue
        located = _PT_LOCATION.match(line)
        if located is None or not located["rest"] or not _looks_like_path(located["path"]):
            continue
        entry = names.next_unused(failed)
        rest = located["rest"].strip()
        if _is_assertion(rest):
            error_type: str | None = "AssertionError"
            message: str | None = rest
        else:
            error_type, message = _split_exception(rest, strict=True)
        nodeid = entry.nodeid if entry is not None else located["path"]
        found.append(
            _Found(
                check=nodeid,
                failed=failed,
                frames=[_Frame(located["path"], located["line"])],
                error_type=error_type,
                message=message,
                test_file=nodeid.split("::", 1)[0],
            )
        )
    return found


# --- unittest -----------------------------------------------------------------------------------


def _unittest_report(lines: Sequence[str]) -> TestReport | None:
    recognised = False
    found: list[_Found] = []
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
    return _report("unittest", found, summary)


def _unittest_block(failed: bool, title: str, body: Sequence[str]) -> _Found:
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
    frames, exception = _python_traceback(body)
    error_type: str | None = None
    message: str | None = None
    if exception is not None:
        error_type, message = _split_exception(exception, strict=False)
    else:  # no traceback: the first line of the block is all there is
        first = next((line.strip() for line in body if line.strip()), "")
        if first:
            error_type, message = _split_exception(first, strict=True)
    return _Found(
        check=check,
        failed=failed,
        frames=frames,
        error_type=error_type,
        message=message,
        test_file=_module_file(check, frames),
    )


def _module_file(check: str, frames: Sequence[_Frame]) -> str | None:
    """The test's own file, relative to the project root: the longest dotted prefix of the id
    that names a frame's file (``tests.test_a.C.test_x`` and ``/r/tests/test_a.py`` →
    ``tests/test_a.py``)."""
    parts = check.split(" ", 1)[0].split(".")
    for k in range(len(parts), 0, -1):
        for suffix in ("/".join(parts[:k]) + ".py", "/".join(parts[:k]) + "/__init__.py"):
            if any(f.path == suffix or f.path.endswith("/" + suffix) for f in frames):
                return suffix
    return None
