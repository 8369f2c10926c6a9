"""Paths the model names, resolved inside the workspace root or refused.

Every path a file tool receives goes through :meth:`Workspace.resolve`: it is joined to the
root, every symbolic link in it is resolved (``os.path.realpath``), and the result must lie
inside the root's own real path. The tools then work on the resolved path, never on the text
the model sent. Unicode look-alikes of ``.`` and ``/`` (fullwidth '．', '／', one-dot leader
'․', division slash '∕') are ordinary characters to the operating system: they name odd files
inside the root, and nothing here normalises them into separators.

The check and the use are two system calls: a process that swaps a directory for a symlink
in between (the shell tool could) might redirect one call. These rules keep a model from
wandering out of its workspace; an operating-system sandbox is what keeps an adversary in.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from pathlib import Path

from polyloop.types import ActionStatus, ConfigError, Outcome

from ._texts import BuiltinTexts

__all__ = ["Refused", "Workspace", "glob_regex", "matches_glob"]

_GLOB_CHARS = frozenset("*?[")


class Refused(Exception):
    """A tool refuses the call before touching the workspace; ``text`` tells the model why.

    Raised inside the tools and turned into ``Outcome(not_executed, text, synthetic=True)`` at
    their edge, never seen by the caller.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def outcome(self) -> Outcome:
        return Outcome(ActionStatus.not_executed, self.text, synthetic=True)


class Workspace:
    """The root, the writable paths, and the rules that keep paths inside the root.

    Args:
        root: an existing directory; its real path (symlinks resolved) is the root.
        writable_paths: paths or globs relative to the root (see :func:`glob_regex`) below
            which writes are allowed; None allows writes anywhere in the root, ``[]`` nowhere.
        texts: the wording of refusals.

    Raises:
        ConfigError: the root is not a directory; ``writable_paths`` is a single string, or
            one of its entries is empty, contains NUL, or lies outside the root.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        writable_paths: Sequence[str | os.PathLike[str]] | None,
        texts: BuiltinTexts,
    ) -> None:
        real = os.path.realpath(os.fspath(root))
        if not os.path.isdir(real):
            raise ConfigError(
                f"workspace_tools: root {os.fspath(root)!r} is not an existing directory"
            )
        self.root = Path(real)
        self._texts = texts
        self._writable: tuple[re.Pattern[str], ...] | None = None
        self._writable_names = ""
        if writable_paths is not None:
            if isinstance(writable_paths, str | os.PathLike):
                raise ConfigError(
                    "workspace_tools: writable_paths must be a list of paths, got the single "
                    f"path {os.fspath(writable_paths)!r}; write writable_paths=[...]"
                )
            entries = [os.fspath(p) for p in writable_paths]
            self._writable = tuple(self._writable_entry(e) for e in entries)
            self._writable_names = ", ".join(entries) if entries else texts.nothing_writable

    @property
    def writable_names(self) -> str | None:
        """The writable paths as the caller gave them, comma-separated; None if all of the
        root is writable."""
        return None if self._writable is None else self._writable_names

    def resolve(self, path: str) -> Path:
        """The real path ``path`` names inside the root.

        ``path`` is relative to the root; an absolute path is accepted when it lies inside the
        root. "" means the root itself. ``~`` is not expanded.

        Raises:
            Refused: ``path`` contains NUL, or it (after ``..`` and symlinks) lies outside
                the root.
        """
        if "\x00" in path:
            raise Refused(self._texts.path_nul.format(path=path))
        joined = os.path.join(self.root, path or ".")
        real = Path(os.path.realpath(joined))
        if real.is_relative_to(self.root):
            return real
        if Path(os.path.normpath(joined)).is_relative_to(self.root):
            template = self._texts.path_symlink  # inside on paper: a link leads out
        elif os.path.isabs(path):
            template = self._texts.path_absolute
        else:
            template = self._texts.path_parent
        raise Refused(template.format(path=path))

    def check_writable(self, real: Path, path: str) -> None:
        """Refuse a write to ``real`` (a path from :meth:`resolve`) outside ``writable_paths``.

        The resolved path is checked, so a symlink inside a writable directory cannot lead a
        write elsewhere in the root.

        Raises:
            Refused: ``real`` is neither a writable path nor below one.
        """
        if self._writable is None:
            return
        rel = self.relative(real)
        candidates = [rel]
        while rel != ".":
            rel = posixpath.dirname(rel) or "."
            candidates.append(rel)
        if any(rx.fullmatch(c) for rx in self._writable for c in candidates):
            return
        raise Refused(self._texts.not_writable.format(path=path, paths=self._writable_names))

    def relative(self, real: Path | str) -> str:
        """``real`` (inside the root) relative to the root, with "/" separators; "." for the
        root itself."""
        rel = os.path.relpath(real, self.root)
        return rel.replace(os.sep, "/") if os.sep != "/" else rel

    def _writable_entry(self, entry: str) -> re.Pattern[str]:
        where = f"workspace_tools: writable_paths entry {entry!r}"
        if not entry or "\x00" in entry:
            raise ConfigError(f"{where} must be a non-empty path without NUL characters")
        if os.path.isabs(entry):
            relative = os.path.relpath(os.path.normpath(entry), self.root)
            if relative.split(os.sep)[0] == "..":
                # the caller may have named the root through a symlink
                relative = os.path.relpath(os.path.realpath(entry), self.root)
            entry = relative
        if _GLOB_CHARS.isdisjoint(entry):
            real = Path(os.path.realpath(os.path.join(self.root, entry)))
            if not real.is_relative_to(self.root):
                raise ConfigError(f"{where} lies outside the workspace root {str(self.root)!r}")
            return re.compile(re.escape(self.relative(real)))
        normal = posixpath.normpath(entry.replace(os.sep, "/"))
        if normal == ".." or normal.startswith("../"):
            raise ConfigError(f"{where} lies outside the workspace root {str(self.root)!r}")
        return glob_regex(normal)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over "/"-separated paths, as a regex to ``fullmatch``: ``*`` and ``?`` match
    within one path segment (never "/"), ``[abc]``/``[!abc]`` one character of a set, and
    ``**`` any number of segments (``a/**/b`` matches ``a/b`` and ``a/x/y/b``)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if i < n and pattern[i] == "/":
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def matches_glob(rx: re.Pattern[str], pattern: str, rel: str) -> bool:
    """Does ``rel`` (a path relative to the listed directory) match ``pattern`` (compiled as
    ``rx``)? A pattern without "/" is matched against the file name only."""
    if "/" not in pattern:
        rel = rel.rsplit("/", 1)[-1]
    return rx.fullmatch(rel) is not None
