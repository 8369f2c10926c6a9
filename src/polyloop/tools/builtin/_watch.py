"""What a shell command changed among the files the workspace tools watch.

The file tools report every edit they make (``Outcome.edits``); a shell command can change
files too (``sed -i``, ``echo > f``, ``rm``, ``git checkout``), and no portable mechanism confines
or records what a process writes. So the ``shell`` tool compares the workspace before and after
each command, for the files that matter:

* **test files** (``test_paths``): a change is reported as the file tools report it, a
  :class:`~polyloop.types.FileEdit` with ``test_file=True`` and the signs of what it did to
  the tests (the whole file before, compared with the whole file after; a deleted file is
  compared with nothing, so its tests count as deleted);
* with ``writable_paths``, **every file outside them**: a change (created, changed, deleted)
  is reported as a ``FileEdit`` and named in the observation. It is not undone.

Cost: each command is bracketed by two walks of the workspace (``os.scandir``, one ``lstat``
per watched file); a test file is read only when its ``(mtime, ctime, size, inode)`` differs
from when it was last read, and its text is kept (memory: the test files' total size, each
up to 10 MiB). Not looked into: directories whose name starts with "." (``.git``, ``.venv``,
caches), ``node_modules``, ``__pycache__``, ``site-packages`` and virtual environments (a
folder holding ``pyvenv.cfg``); only regular files are watched. A change made meanwhile by
another process (another run in the same workspace, a journal kept in it) is reported as
the command's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from polyloop.types import FileEdit

from ._files import MAX_FILE_BYTES
from ._paths import Workspace
from ._test_edits import TestPaths

__all__ = ["ShellWatch", "Snapshot"]

_SKIPPED = frozenset({"node_modules", "__pycache__", "site-packages"})
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

_NO, _TEST, _OUTSIDE = "no", "test", "outside"  # what a path is to the watch

Key = tuple[int, int, int, int]
Snapshot = dict[str, Key]
"""The watched files of the workspace (relative, "/"-separated) and their stat keys."""


class ShellWatch:
    """The test files and (with ``writable_paths``) the files outside them, compared around
    each shell command (see the module docstring). Not thread-safe: one command at a time
    (the ``shell`` tool runs its commands one after another within a run)."""

    def __init__(self, workspace: Workspace, tests: TestPaths) -> None:
        self._ws = workspace
        self._root = str(workspace.root)
        self._tests = tests
        self._outside = workspace.writable_names is not None
        self._texts: dict[str, tuple[Key, str]] = {}
        self._verdicts: dict[str, str] = {}
        self.active = bool(tests.globs) or self._outside
        """Anything to watch: False with ``test_paths=[]`` and no ``writable_paths``."""

    def snapshot(self) -> Snapshot:
        """The watched files now; the text of each test file whose key changed is read."""
        keys = dict(self._walk())
        for rel, key in keys.items():
            cached = self._texts.get(rel)
            if self._is_test(rel) and (cached is None or cached[0] != key):
                self._texts[rel] = (key, self._read(rel))
        for rel in [r for r in self._texts if r not in keys]:
            del self._texts[rel]
        return keys

    def changes(self, before: Snapshot) -> tuple[tuple[FileEdit, ...], tuple[str, ...]]:
        """What changed since ``before``: the edits (sorted by path) and, of them, the paths
        outside ``writable_paths``."""
        after = dict(self._walk())
        edits: list[FileEdit] = []
        outside: list[str] = []
        for rel in sorted(before.keys() | after.keys()):
            old, new = before.get(rel), after.get(rel)
            if old == new:
                continue
            if self._is_test(rel):
                cached = self._texts.pop(rel, None)
                text = cached[1] if cached is not None and cached[0] == old else ""
                now = "" if new is None else self._read(rel)
                if new is not None:
                    self._texts[rel] = (new, now)
                edits.append(self._tests.edit(rel, text, now))
            else:
                edits.append(FileEdit(rel))
            if self._outside_writable(rel):
                outside.append(rel)
        return tuple(edits), tuple(outside)

    def _walk(self) -> Iterator[tuple[str, Key]]:
        """Each watched regular file and its key, never following a symlink."""
        todo = [""]
        while todo:
            prefix = todo.pop()
            try:
                with os.scandir(os.path.join(self._root, prefix)) as it:
                    entries = list(it)
            except OSError:  # gone or unreadable meanwhile: nothing to watch in it
                continue
            if prefix and any(e.name == "pyvenv.cfg" for e in entries):
                continue
            for entry in entries:
                rel = prefix + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if not entry.name.startswith(".") and entry.name not in _SKIPPED:
                            todo.append(rel + "/")
                        continue
                    if not self._watched(rel):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield rel, (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)

    def _watched(self, rel: str) -> bool:
        """Is ``rel`` a test file, or outside ``writable_paths``? (Matched once per path.)"""
        verdict = self._verdicts.get(rel)
        if verdict is None:
            test = rel in self._tests
            verdict = _TEST if test else _OUTSIDE if self._outside_writable(rel) else _NO
            self._verdicts[rel] = verdict
        return verdict is not _NO

    def _is_test(self, rel: str) -> bool:
        return self._verdicts.get(rel) is _TEST

    def _outside_writable(self, rel: str) -> bool:
        return self._outside and not self._ws.is_writable(rel)

    def _read(self, rel: str) -> str:
        """A test file's text, to compare (up to 10 MiB, decoded leniently); "" if it cannot
        be read."""
        try:
            fd = os.open(os.path.join(self._root, rel), os.O_RDONLY | _O_NOFOLLOW)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            try:
                return f.read(MAX_FILE_BYTES).decode("utf-8", "replace")
            except OSError:
                return ""
