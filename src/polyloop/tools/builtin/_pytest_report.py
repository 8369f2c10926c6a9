"""The pytest reader of :func:`~._test_reports.extract_failures`, for every style it lists."""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ._report_parts import (
    FRAMEWORK,
    PY_FRAME,
    TRACEBACK,
    Found,
    Frame,
    Read,
    after_last_chain,
    is_assertion,
    python_traceback,
    split_exception,
)

__all__ = ["read_pytest"]

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
_TEST_MODULE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test)\.py$")
_FILE_LIKE = re.compile(r"\.[A-Za-z]\w*$|^<.*>$")


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


def read_pytest(lines: Sequence[str]) -> Read | None:
    """The entries of a pytest report in ``lines``; None when they hold no pytest report."""
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
    found: list[Found] = []
    for failed, block in blocks:
        found.extend(_pytest_block(block, failed, names))
    for entry in listed.values():
        if not entry.used:  # --tb=no, or a section the output cap cut away
            found.append(_from_summary(entry))
    return Read(found, stats, roots)


def _pytest_block(lines: list[str], failed: bool, names: _Names) -> list[Found]:
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

    def claim(self, failed: bool, name: str, frames: list[Frame]) -> _Listed | None:
        """The first unused node of this kind whose domain (or id) is ``name``; of the first
        few, one whose file is among the frames is preferred (two files can hold tests of the
        same name)."""
        queue = self._by_name.get((failed, name))
        if not queue:
            return None
        _drop_used(queue)
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
        _drop_used(queue)
        if not queue:
            return None
        entry = queue.popleft()
        entry.used = True
        return entry


def _drop_used(queue: deque[_Listed]) -> None:
    while queue and queue[0].used:
        queue.popleft()


def _pytest_entry(title: str, body: list[str], failed: bool, names: _Names) -> Found:
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
            ours = [f.path for f in frames if not FRAMEWORK.search(f.path)]
            file = next((p for p in ours if _TEST_MODULE.search(p)), ours[0] if ours else None)
            name = base.replace(".", "::") + bracket + params
            nodeid = f"{file}::{name}" if file else name
    summary_type, summary_message = _fields(entry.message if entry else None)
    if error_type is None:
        error_type = crash_type or summary_type
    if message is None:
        message = summary_message
    return Found(
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
) -> tuple[list[Frame], str | None, str | None, str | None]:
    """``(frames, error type, message, type named by the last location line)`` of one entry
    in any ``--tb`` style."""
    lines: list[str] = []
    for line in body:
        if "Captured" in line and _PT_SUBSECTION.match(line):
            break  # what the test printed follows: never read it as a traceback
        lines.append(line)
    lines = list(after_last_chain(lines))
    frames: list[Frame] = []
    groups: list[list[str]] = []
    crash_type: str | None = None
    previous_e = False
    for line in lines:
        if line.startswith("E") and (len(line) == 1 or line[1] == " "):
            content = line[1:].strip()
            framed = PY_FRAME.match(content)
            if framed is not None:  # a SyntaxError's own location
                frames.append(Frame(framed["path"], framed["line"]))
            if not previous_e:
                groups.append([])
            groups[-1].append(content)
            previous_e = True
            continue
        previous_e = False
        framed = PY_FRAME.match(line) or _PT_FIXTURE_FILE.match(line)
        if framed is not None:
            frames.append(Frame(framed["path"], framed["line"]))
            continue
        located = _PT_LOCATION.match(line)
        if located is not None and _looks_like_path(located["path"]):
            frames.append(Frame(located["path"], located["line"]))
            rest = (located["rest"] or "").strip()
            crash_type = None
            if rest and not rest.startswith("in "):
                crash_type, _ = split_exception(rest, strict=True)
    if groups:
        error_type, message = _e_group(groups[-1])
        return frames, error_type, message, crash_type
    if any(TRACEBACK.match(line) for line in lines):  # --tb=native
        _, exception = python_traceback(lines)
        if exception is not None:
            error_type, message = split_exception(exception, strict=False)
            return frames, error_type, message, crash_type
    return frames, None, None, crash_type


def _looks_like_path(path: str) -> bool:
    return " = " not in path and bool(_FILE_LIKE.search(path))


def _e_group(group: list[str]) -> tuple[str | None, str | None]:
    """The error type and message of pytest's ``E`` lines."""
    first = next((line for line in group if line), "")
    if is_assertion(first):
        return "AssertionError", first
    for line in group:
        error_type, message = split_exception(line, strict=True)
        if error_type is not None:
            return error_type, message
    if _FIXTURE_NOT_FOUND.match(first):
        return "FixtureLookupError", first
    return None, first or None


def _fields(message: str | None) -> tuple[str | None, str | None]:
    """Error type and message of a summary line's text (pytest may have cut it with "...") or
    of a ``--tb=line`` crash line's."""
    if not message:
        return None, None
    message = message.strip()
    if is_assertion(message):
        return "AssertionError", message
    error_type, rest = split_exception(message, strict=True)
    return error_type, rest


def _from_summary(entry: _Listed) -> Found:
    entry.used = True
    error_type, message = _fields(entry.message)
    return Found(
        check=entry.nodeid,
        failed=entry.failed,
        error_type=error_type,
        message=message,
        test_file=entry.nodeid.split("::", 1)[0],
    )


def _pytest_crash_lines(lines: list[str], failed: bool, names: _Names) -> list[Found]:
    """``--tb=line``: one ``path:line: message`` per entry, in the summary's order."""
    found: list[Found] = []
    for line in lines:
        if line.startswith("E "):
            continue
        located = _PT_LOCATION.match(line)
        if located is None or not located["rest"] or not _looks_like_path(located["path"]):
            continue
        entry = names.next_unused(failed)
        error_type, message = _fields(located["rest"])
        nodeid = entry.nodeid if entry is not None else located["path"]
        found.append(
            Found(
                check=nodeid,
                failed=failed,
                frames=[Frame(located["path"], located["line"])],
                error_type=error_type,
                message=message,
                test_file=nodeid.split("::", 1)[0],
            )
        )
    return found
