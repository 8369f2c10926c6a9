"""The file tools' work: read, write, edit, list and grep inside a :class:`Workspace`.

Each method returns the observation (a ``str``, or an ``Outcome`` when it reports
``truncated_chars``) or raises :class:`Refused` before changing anything. Output is capped at
``max_output_chars`` characters of content; ``truncated_chars`` counts the characters of the
result the model did not see (notes the tools add are not counted), exactly where the tool read
them, and as bytes of the file where it did not (see :meth:`Files.read`).

Every file is opened through :meth:`Workspace.locate` (relative to an open directory, never
through a symlink), and directories are walked the same way, so nothing here reads or writes
outside the root. ``edit_file`` and ``grep`` handle files of up to :data:`MAX_FILE_BYTES`;
``read_file`` streams and stops reading where its output is full. Names that are not UTF-8 are
shown with U+FFFD for each undecodable byte, with a note saying so: no lone surrogate leaves
these tools.
"""

from __future__ import annotations

import codecs
import os
import posixpath
import re
import stat
from collections.abc import Iterator
from typing import BinaryIO

from polyloop.types import ActionStatus, Outcome

from ._paths import DIR_FLAGS, FILE_FLAGS, Located, Refused, Workspace, glob_regex, matches_glob
from ._test_edits import DEFAULT_TEST_PATHS, TestPaths, edited_lines
from ._texts import BuiltinTexts

__all__ = ["MAX_FILE_BYTES", "MAX_FILE_MIB", "Files"]

MAX_FILE_MIB = 10
MAX_FILE_BYTES = MAX_FILE_MIB << 20
"""The largest file ``edit_file`` changes (it holds the file in memory) and ``grep`` searches
(a larger one is skipped with a note, or refused when named alone): 10 MiB."""
_SNIFF_BYTES = 8192  # like git: a NUL in the first 8 KiB makes a file binary
_CHUNK = 1 << 16
_SCAN = 1 << 20
_GREP_LINE_CHARS = 400
_EDIT_LINES_SHOWN = 10
_SKIPPED_DIRS = frozenset({".git"})
_LARGE_NAMES_SHOWN = 5
_SURROGATE = re.compile("[\ud800-\udfff]")


class _LineCap:
    """Lines joined by "\\n", kept up to ``limit`` characters (whole lines, unless the first
    line alone is longer); counts everything, kept or not."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: list[str] = []
        self.lines = 0
        self.full = 0
        self.shown = 0
        self.omitted_lines = 0
        self.stopped = False

    def add(self, line: str, *, extra: int = 0) -> None:
        """Add ``line``; ``extra`` characters of it were already cut by the caller."""
        sep = 1 if self.lines else 0
        self.lines += 1
        self.full += sep + len(line) + extra
        if self.stopped:
            self.omitted_lines += 1
        elif self.shown + sep + len(line) <= self.limit:
            self.kept.append(line)
            self.shown += sep + len(line)
        else:
            self.stopped = True
            if self.kept:
                self.omitted_lines += 1
            else:
                self.kept.append(line[: self.limit])
                self.shown = self.limit

    @property
    def text(self) -> str:
        return "\n".join(self.kept)

    @property
    def truncated(self) -> int:
        return self.full - self.shown


def _outcome(text: str, truncated: int) -> str | Outcome:
    if truncated:
        return Outcome(ActionStatus.executed, text, truncated_chars=truncated)
    return text


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


class Files:
    """The file tools bound to one workspace."""

    def __init__(
        self,
        workspace: Workspace,
        texts: BuiltinTexts,
        max_output_chars: int,
        tests: TestPaths | None = None,
    ) -> None:
        self._ws = workspace
        self._texts = texts
        self._max = max_output_chars
        self._tests = TestPaths(DEFAULT_TEST_PATHS) if tests is None else tests

    # --- read_file ----------------------------------------------------------------------------

    def read(self, path: str, offset: int, limit: int | None) -> str | Outcome:
        """Lines ``offset`` to ``offset + limit`` of a UTF-8 file, cut at the cap.

        Only what is shown is decoded, and reading stops where the output is full (one 64 KiB
        piece past it at most), so a file of any size costs about ``max_output_chars`` of
        reading. The lines before ``offset`` are skipped by scanning for line ends (not
        decoded, so not checked for UTF-8); a bad byte after the cut is never seen. What was
        cut is counted in bytes of the file, from the end of the shown text to the end of the
        selection (characters for ASCII text, an upper bound otherwise): the end of the file,
        or with a ``limit`` the end of its last line, found by the same scan.
        """
        with self._ws.locate(path) as found:
            self._regular_file(found)
            with found.open_file() as f:
                size = os.fstat(f.fileno()).st_size
                if b"\x00" in f.read(_SNIFF_BYTES):
                    raise Refused(self._texts.binary_file.format(path=path, size=size))
                f.seek(0)
                return self._read(f, path, size, offset, limit)

    def _read(
        self, f: BinaryIO, path: str, size: int, offset: int, limit: int | None
    ) -> str | Outcome:
        t = self._texts
        end = None if limit is None else offset + limit
        line, consumed, partial = _skip_lines(f, offset)  # line: index of the current line
        start = consumed  # the byte where the selection begins
        decoder = codecs.getincrementaldecoder("utf-8")()
        parts: list[str] = []
        shown = 0  # characters in parts
        line_start = 0  # `shown` when the current line began
        selected = 0  # characters read of the selected lines
        cut: str | None = None
        next_offset = 0
        long_line: int | None = None
        while end is None or line < end:
            piece = f.readline(_CHUNK)
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(piece, final=not piece)
            except UnicodeDecodeError as exc:
                position = consumed - pending + exc.start
                raise Refused(t.not_utf8.format(path=path, size=size, position=position)) from None
            if not piece:
                break
            consumed += len(piece)
            selected += len(text)
            if shown + len(text) <= self._max:
                parts.append(text)
                shown += len(text)
            elif line_start > 0:  # stop before the line that won't fit
                cut = "".join(parts)[:line_start]
                next_offset = line
            else:  # the first line alone is over the cap
                cut = ("".join(parts) + text)[: self._max]
                next_offset, long_line = line + 1, line
            partial = not piece.endswith(b"\n")
            if not partial:
                line += 1
                line_start = shown
            if cut is not None:
                break  # never read what will not be shown
        if cut is None:
            if selected:
                return "".join(parts)
            if offset == 0:
                return t.empty_file.format(path=path)
            lines = line + (1 if partial else 0)
            raise Refused(t.past_end.format(offset=offset, path=path, lines=lines))
        stop = max(size, consumed) if end is None else consumed + _scan_lines(f, end - line)
        truncated = stop - (start + len(cut.encode("utf-8")))
        if long_line is None:
            note = t.read_cut.format(cut=truncated, next_offset=next_offset)
        else:
            note = t.read_cut_long_line.format(
                cut=truncated,
                line=long_line,
                max_output_chars=self._max,
                next_offset=next_offset,
            )
        separator = "" if cut.endswith("\n") else "\n"
        return Outcome(ActionStatus.executed, cut + separator + note, truncated_chars=truncated)

    # --- write_file and edit_file ---------------------------------------------------------------

    def write(self, path: str, content: str) -> Outcome:
        """Create or replace a file with ``content`` (see :meth:`Located.replace`); the
        outcome reports the edit (a test file's is compared with what it replaced)."""
        t = self._texts
        data = self._encode(content, path)
        with self._ws.locate(path, write=True, create=True) as found:
            existed = found.st is not None
            before = ""
            if existed:
                self._regular_file(found)
                if found.rel in self._tests:
                    before = self._previous(found)
            found.replace(data)
            edit = self._tests.edit(found.rel, before, content)
        template = t.overwritten if existed else t.created
        text = template.format(path=path, chars=len(content), lines=_line_count(content))
        return Outcome(ActionStatus.executed, text, edits=(edit,))

    def _previous(self, found: Located) -> str:
        """The text a write replaces, to compare a test file with (up to
        :data:`MAX_FILE_BYTES`, decoded leniently: it is only read for the comparison)."""
        try:
            with found.open_file() as f:
                return f.read(MAX_FILE_BYTES).decode("utf-8", "replace")
        except (OSError, Refused):
            return ""

    def edit(self, path: str, old: str, new: str) -> Outcome:
        """Replace the one occurrence of ``old`` with ``new``, in a file of at most
        :data:`MAX_FILE_BYTES` (a larger one is refused: it would be held in memory)."""
        t = self._texts
        with self._ws.locate(path, write=True) as found:
            self._regular_file(found)
            with found.open_file() as f:
                size = os.fstat(f.fileno()).st_size
                if size <= MAX_FILE_BYTES:
                    data = f.read(MAX_FILE_BYTES + 1)
                    size = max(size, len(data))  # it may have grown meanwhile
            if size > MAX_FILE_BYTES:
                raise Refused(t.edit_too_large.format(path=path, size=size, max_mib=MAX_FILE_MIB))
            try:
                if b"\x00" in data[:_SNIFF_BYTES]:
                    raise UnicodeError
                text = data.decode("utf-8")
            except UnicodeError:
                raise Refused(t.edit_binary.format(path=path, size=size)) from None
            if not old:
                raise Refused(t.edit_empty_old)
            count = text.count(old)
            if count == 0:
                crlf = "\r\n" in text and "\n" in old and old.replace("\n", "\r\n") in text
                hint = t.edit_crlf_hint if crlf else ""
                raise Refused(t.edit_not_found.format(path=path, hint=hint))
            if count > 1:
                starts = list(_occurrences(text, old, _EDIT_LINES_SHOWN))
                more = ", ..." if count > len(starts) else ""
                shown = ", ".join(str(n) for n in starts) + more
                raise Refused(t.edit_ambiguous.format(count=count, path=path, lines=shown))
            if old == new:
                raise Refused(t.edit_unchanged)
            index = text.index(old)
            changed = text[:index] + new + text[index + len(old) :]
            found.replace(self._encode(changed, path))
            first, last = edited_lines(text, index, index + len(old))
            after = changed[first : last + len(new) - len(old)]
            edit = self._tests.edit(found.rel, text[first:last], after)
        observation = t.edited.format(
            path=path,
            line=text.count("\n", 0, index) + 1,
            old_lines=_line_count(old),
            new_lines=_line_count(new),
        )
        return Outcome(ActionStatus.executed, observation, edits=(edit,))

    # --- list_files -------------------------------------------------------------------------

    def listing(self, path: str, pattern: str | None) -> str | Outcome:
        """The files under ``path``, one per line, cut at the cap."""
        t = self._texts
        rx = glob_regex(pattern) if pattern else None
        entries: list[str] = []
        with self._ws.locate(path) as found:
            self._exists(found)
            for rel, base, kind, _, _ in self._walk(found):
                if rx is not None and pattern and not matches_glob(rx, pattern, base):
                    continue
                entries.append(f"{rel} -> {self._link_target(rel)}" if kind == "link" else rel)
        if not entries:
            if pattern:
                return t.list_empty_pattern.format(pattern=pattern, path=path)
            return t.list_empty.format(path=path)
        cap = _LineCap(self._max)
        names = _Names()
        for entry in sorted(entries):
            cap.add(names.shown(entry))
        if not cap.truncated:
            return names.noted(cap.text, t)
        note = t.list_cut.format(more=cap.omitted_lines, cut=cap.truncated)
        return _outcome(names.noted(f"{cap.text}\n{note}", t), cap.truncated)

    # --- grep -------------------------------------------------------------------------------

    def grep(self, pattern: str, path: str, glob: str | None) -> str | Outcome:
        """Lines matching ``pattern`` in the text files under ``path``, cut at the cap.

        Files larger than :data:`MAX_FILE_BYTES` are not searched: one named by ``path`` is
        refused, those found under a directory are skipped and named in a note."""
        t = self._texts
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise Refused(t.bad_regex.format(pattern=pattern, reason=exc)) from None
        rx = glob_regex(glob) if glob else None
        cap = _LineCap(self._max)
        names = _Names()
        searched = binary = 0
        large: list[str] = []
        with self._ws.locate(path) as found:
            self._exists(found)
            st = found.st
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > MAX_FILE_BYTES:
                raise Refused(
                    t.grep_too_large.format(path=path, size=st.st_size, max_mib=MAX_FILE_MIB)
                )
            for rel, base, kind, dir_fd, name in self._walk(found):
                if rx is not None and glob and not matches_glob(rx, glob, base):
                    continue
                f = self._open_entry(rel, kind, dir_fd, name)
                if f is None:
                    continue  # not a regular file, unreadable, or a link that leads out
                with f:
                    if os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
                        large.append(rel)
                        continue
                    try:
                        if b"\x00" in f.read(_SNIFF_BYTES):
                            binary += 1
                            continue
                        f.seek(0)
                        searched += 1
                        prefix = names.shown(rel)
                        for number, line in _lines(f):
                            if regex.search(line):
                                self._add_match(cap, f"{prefix}:{number}:", line)
                    except OSError:
                        continue  # unreadable: skipped, like a binary file
        notes = []
        if large:
            listed = ", ".join(names.shown(r) for r in large[:_LARGE_NAMES_SHOWN])
            listed += ", ..." if len(large) > _LARGE_NAMES_SHOWN else ""
            notes.append(
                t.grep_skipped_large.format(count=len(large), max_mib=MAX_FILE_MIB, names=listed)
            )
        if not cap.lines:
            text = t.grep_none.format(pattern=pattern, path=path, files=searched, binary=binary)
            return names.noted(text, t, *notes)
        if not cap.truncated:
            return names.noted(cap.text, t, *notes)
        if cap.omitted_lines:
            note = t.grep_cut.format(more=cap.omitted_lines, cut=cap.truncated)
            return _outcome(names.noted(f"{cap.text}\n{note}", t, *notes), cap.truncated)
        # only long lines were shortened
        return _outcome(names.noted(cap.text, t, *notes), cap.truncated)

    def _add_match(self, cap: _LineCap, prefix: str, line: str) -> None:
        marker = self._texts.grep_line_cut
        if len(line) <= _GREP_LINE_CHARS:
            cap.add(prefix + line)
            return
        kept = line[:_GREP_LINE_CHARS]
        # the marker is ours, not content: count everything after `kept` as cut
        cap.add(prefix + kept + marker, extra=len(line) - len(kept) - len(marker))

    def _open_entry(self, rel: str, kind: str, dir_fd: int, name: str) -> BinaryIO | None:
        """A regular file found by :meth:`_walk`, open for reading, or None."""
        if kind == "link":  # followed only while it stays inside the workspace
            try:
                with self._ws.locate(rel) as target:
                    if target.st is None or not stat.S_ISREG(target.st.st_mode):
                        return None
                    return target.open_file()
            except Refused:
                return None
        if kind != "file":
            return None  # opening a pipe or a device could block or have effects
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")

    # --- helpers ------------------------------------------------------------------------------

    def _walk(self, found: Located) -> Iterator[tuple[str, str, str, int, str]]:
        """``(path relative to the root, path relative to found, kind, dir_fd, name)`` for
        every entry that is not a directory under ``found`` (``found`` itself if it is not a
        directory), in the order of their sorted paths; ``kind`` is "file", "link" or "other";
        ``dir_fd`` (open while the entry is current) holds ``name``. Directories are opened
        relative to their parent without following symlinks; ``.git`` is skipped, and so is a
        directory that cannot be opened (unreadable, or swapped for something else)."""
        st = found.st
        if st is None or not stat.S_ISDIR(st.st_mode):
            kind = "file" if st is not None and stat.S_ISREG(st.st_mode) else "other"
            yield found.rel, posixpath.basename(found.rel), kind, found.dir_fd, found.name
            return
        top = found.open_dir()
        try:
            entries = _sorted_entries(top)
        except OSError as exc:
            os.close(top)
            raise Refused(
                self._texts.os_error.format(path=found.path, reason=exc.strerror or exc)
            ) from None
        stack = [(top, found.rel, "", entries)]
        try:
            while stack:
                fd, rel_dir, base_dir, pending = stack[-1]
                entry = next(pending, None)
                if entry is None:
                    stack.pop()
                    os.close(fd)
                    continue
                name = entry.name
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                base = f"{base_dir}/{name}" if base_dir else name
                if entry.is_dir(follow_symlinks=False):
                    if name in _SKIPPED_DIRS:
                        continue
                    try:
                        sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue
                    try:
                        stack.append((sub, rel, base, _sorted_entries(sub)))
                    except OSError:
                        os.close(sub)
                elif entry.is_symlink():
                    yield rel, base, "link", fd, name
                elif entry.is_file(follow_symlinks=False):
                    yield rel, base, "file", fd, name
                else:
                    yield rel, base, "other", fd, name
        finally:
            for fd, *_ in stack:
                os.close(fd)

    def _link_target(self, rel: str) -> str:
        try:
            with self._ws.locate(rel) as target:
                if target.st is None:
                    return f"{target.rel} (missing)"
                return target.rel + ("/" if stat.S_ISDIR(target.st.st_mode) else "")
        except Refused as refused:
            return "(outside the workspace)" if refused.escape else "(unreadable)"

    def _exists(self, found: Located) -> os.stat_result:
        if found.st is None:
            raise Refused(self._texts.not_found.format(path=found.path))
        return found.st

    def _regular_file(self, found: Located) -> os.stat_result:
        st = self._exists(found)
        if stat.S_ISDIR(st.st_mode):
            raise Refused(self._texts.is_directory.format(path=found.path))
        if not stat.S_ISREG(st.st_mode):
            raise Refused(self._texts.not_regular.format(path=found.path))
        return st

    def _encode(self, text: str, path: str) -> bytes:
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Refused(self._texts.bad_unicode.format(path=path, reason=exc.reason)) from None


class _Names:
    """Shows names with U+FFFD in place of the bytes that are not UTF-8 (which ``os`` hands
    over as lone surrogates), and remembers whether it did."""

    def __init__(self) -> None:
        self.replaced = False

    def shown(self, text: str) -> str:
        if text.isascii():  # the common case costs one check
            return text
        fixed = _SURROGATE.sub("\ufffd", text)
        if fixed != text:
            self.replaced = True
        return fixed

    def noted(self, text: str, texts: BuiltinTexts, *notes: str) -> str:
        """``text`` with ``notes`` and, if a name was replaced, the note saying so."""
        if self.replaced:
            notes = (*notes, texts.names_not_utf8)
        return "\n".join((text, *notes))


def _sorted_entries(fd: int) -> Iterator[os.DirEntry[str]]:
    """The entries of the directory ``fd``, in the order their paths sort in (a directory's
    name sorts as if followed by "/")."""
    with os.scandir(fd) as it:
        entries = list(it)
    entries.sort(key=lambda e: e.name + "/" if e.is_dir(follow_symlinks=False) else e.name)
    return iter(entries)


def _nth_newline(chunk: bytes, n: int) -> int:
    """The index of the ``n``-th b"\\n" in ``chunk`` (which has at least ``n``)."""
    index = -1
    for _ in range(n):
        index = chunk.index(b"\n", index + 1)
    return index


def _skip_lines(f: BinaryIO, offset: int) -> tuple[int, int, bool]:
    """Move ``f`` (at its start) past ``offset`` lines by scanning for line ends; return
    ``(lines skipped, bytes skipped, the file ended inside a line)``."""
    line = consumed = 0
    last = b""
    while offset:
        chunk = f.read(_SCAN)
        if not chunk:
            return line, consumed, not last.endswith(b"\n") and bool(last)
        count = chunk.count(b"\n")
        if line + count >= offset:
            consumed += _nth_newline(chunk, offset - line) + 1
            f.seek(consumed)
            return offset, consumed, False
        line += count
        consumed += len(chunk)
        last = chunk
    return 0, 0, False


def _scan_lines(f: BinaryIO, lines: int) -> int:
    """The bytes from where ``f`` is to the end of the ``lines``-th line from there (or to
    the end of the file), found without decoding."""
    total = 0
    while lines > 0:
        chunk = f.read(_SCAN)
        if not chunk:
            break
        count = chunk.count(b"\n")
        if count >= lines:
            return total + _nth_newline(chunk, lines) + 1
        total += len(chunk)
        lines -= count
    return total


def _lines(f: BinaryIO) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text)`` for the lines of a binary file, decoded leniently,
    without their line endings. A line longer than 1 MiB comes in pieces, each with the
    line's number (so memory stays bounded)."""
    number = 1
    while piece := f.readline(1 << 20):
        yield number, piece.decode("utf-8", "replace").rstrip("\r\n")
        if piece.endswith(b"\n"):
            number += 1


def _occurrences(text: str, old: str, most: int) -> Iterator[int]:
    """The 1-based lines where the first ``most`` occurrences of ``old`` start."""
    index = text.find(old)
    found = 0
    while index != -1 and found < most:
        yield text.count("\n", 0, index) + 1
        found += 1
        index = text.find(old, index + len(old))
