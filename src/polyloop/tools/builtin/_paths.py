"""Paths the model names, located inside the workspace root by construction, or refused.

Every path a file tool receives goes through :meth:`Workspace.locate`. It never hands a path
to the operating system: it opens the root as a directory and walks one component at a time,
each opened relative to the directory before it with ``O_NOFOLLOW`` (``os.open(name, ...,
dir_fd=parent)``). A symbolic link is never followed by the kernel: it is read
(``os.readlink``) and its target walked the same way, and one whose target leaves the root (an
absolute target elsewhere, or more ``..`` than there are directories) is refused. ``..`` goes
back to the directory this walk came from, never to whatever the kernel's ``..`` is now. So a
directory or file swapped for a symlink while a tool runs can make the call fail, never lead it
outside: what the tool opens is a name in a directory it holds open. Writes go through a
temporary file in that same directory, renamed over the name relative to it.

Unicode look-alikes of ``.`` and ``/`` (fullwidth '．', '／', one-dot leader '․', division slash
'∕') are ordinary characters to the operating system: they name odd files inside the root, and
nothing here normalises them into separators.

These rules keep every file tool inside its workspace; they do not confine the shell tool (an
operating-system sandbox does that). A directory moved out of the root by another process while
a tool holds it open is out of reach of any path check.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import secrets
import stat
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from polyloop.types import ActionStatus, ConfigError, Outcome

from ._texts import BuiltinTexts

__all__ = ["Located", "Refused", "Workspace", "glob_regex", "matches_glob"]

_GLOB_CHARS = frozenset("*?[")
_MAX_LINKS = 40  # like Linux's MAXSYMLINKS: more is a loop
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_ELOOP = getattr(errno, "ELOOP", -1)
_ETXTBSY = getattr(errno, "ETXTBSY", -1)
_WRITE_CHECK_FLAGS = os.O_WRONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
"""Flags that open a directory, never through a symlink."""
FILE_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
"""Flags that open a file to read, never through a symlink (and never blocking on a FIFO)."""
# Directories on the way are only passed through: Linux's O_PATH needs no read permission
# (like the kernel's own walk, which needs only search permission).
_WALK_FLAGS = (getattr(os, "O_PATH", 0) or os.O_RDONLY) | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC


def _platform_confines() -> bool:
    """Does this platform have what :meth:`Workspace.locate` needs to confine paths?"""
    flags = (_O_NOFOLLOW, _O_DIRECTORY, _O_CLOEXEC, _O_NONBLOCK)
    dir_fd = {os.open, os.stat, os.mkdir, os.readlink, os.rename, os.unlink}  # rename: replace
    return all(flags) and dir_fd <= os.supports_dir_fd and os.scandir in os.supports_fd


class Refused(Exception):
    """A tool refuses the call before changing the workspace; ``text`` tells the model why.

    Raised inside the tools and turned into ``Outcome(not_executed, text, synthetic=True)`` at
    their edge, never seen by the caller. ``escape`` is True when the path leads outside the
    root.
    """

    def __init__(self, text: str, *, escape: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.escape = escape

    def outcome(self) -> Outcome:
        return Outcome(ActionStatus.not_executed, self.text, synthetic=True)


class Located:
    """A path found inside the root: the directory that holds it, open, and its name there.

    ``dir_fd`` is an open directory inside the root (owned: :meth:`close`, or use ``with``);
    ``name`` is one component in it, "." when the path names that directory itself, or, when a
    directory on the way is missing, the rest of the path. ``rel`` is where that is relative to
    the root ("/"-separated, symlinks resolved; "." for the root). ``st`` is its ``lstat`` when
    located (never a symlink), or None if it does not exist.
    """

    __slots__ = ("_texts", "dir_fd", "name", "path", "rel", "st")

    def __init__(
        self,
        dir_fd: int,
        name: str,
        rel: str,
        st: os.stat_result | None,
        path: str,
        texts: BuiltinTexts,
    ) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.rel = rel
        self.st = st
        self.path = path
        self._texts = texts

    def __enter__(self) -> Located:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def open_file(self) -> BinaryIO:
        """Open the regular file for reading, without following a symlink; ``st`` becomes its
        ``fstat``.

        Raises:
            Refused: it is no longer a regular file (it was swapped for a symlink, a directory
                or a special file since it was located), or the system refuses to open it.
        """
        t = self._texts
        try:
            fd = os.open(self.name, FILE_FLAGS, dir_fd=self.dir_fd)
        except OSError as exc:
            raise self._failed(exc) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise Refused(t.not_regular.format(path=self.path))
        self.st = st
        return os.fdopen(fd, "rb")

    def open_dir(self) -> int:
        """A new descriptor of the directory, opened without following a symlink.

        Raises:
            Refused: it is no longer a directory, or the system refuses to open it.
        """
        try:
            return os.open(self.name, DIR_FLAGS, dir_fd=self.dir_fd)
        except OSError as exc:
            raise self._failed(exc) from None

    def replace(self, data: bytes) -> None:
        """Make the file hold exactly ``data``: write a temporary file in the same directory and
        rename it over the name (both relative to ``dir_fd``), so a reader sees the old content
        or the new one, never a mix, and a symlink put in its place is replaced, never
        followed. An existing file keeps its permission bits (and, where allowed, its owner); a
        new one gets ``0o666`` less the umask. Nothing is fsynced (as with ``open(..., "w")``):
        an operating-system crash may lose the write. Other hard links keep the old content.
        An existing file is replaced only if it could be opened for writing (its permission
        bits, ACLs, a read-only mount): the rename alone needs only the directory's
        permission, and would replace a file its user may only read.

        Raises:
            Refused: the system refused (no space, permission denied, the name became a
                directory); the file and the directory are as they were.
        """
        if self.st is not None:
            self._check_writable()
        tmp = f".polyloop-{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o666, dir_fd=self.dir_fd)
        except OSError as exc:
            raise self._failed(exc) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self.st is not None:
                    os.fchmod(fd, stat.S_IMODE(self.st.st_mode))
                    if (self.st.st_uid, self.st.st_gid) != (os.geteuid(), os.getegid()):
                        with suppress(OSError):  # only root may give a file away
                            os.fchown(fd, self.st.st_uid, self.st.st_gid)
            os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException as exc:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=self.dir_fd)
            if isinstance(exc, OSError):
                raise self._failed(exc) from None
            raise

    def _check_writable(self) -> None:
        """Refuse unless the existing file may be written: the kernel's own check, by opening
        it for writing (not truncating, never through a symlink) and closing it."""
        try:
            fd = os.open(self.name, _WRITE_CHECK_FLAGS, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno == _ETXTBSY:  # a running program: replacing it is fine
                return
            raise self._failed(exc) from None
        os.close(fd)

    def _failed(self, exc: OSError) -> Refused:
        t = self._texts
        changed = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
        if isinstance(exc, changed) or exc.errno == _ELOOP:
            return Refused(t.path_changed.format(path=self.path))
        return Refused(t.os_error.format(path=self.path, reason=exc.strerror or exc))


class Workspace:
    """The root, the writable paths, and the rules that keep paths inside the root.

    Args:
        root: an existing directory; its real path (symlinks resolved) is the root.
        writable_paths: paths or globs relative to the root (see :func:`glob_regex`) below
            which writes are allowed; None allows writes anywhere in the root, ``[]`` nowhere.
            An entry starting with "!" excludes: nothing matching it (or below it) may be
            written, whatever else allows it; with only such entries, the rest is writable.
        texts: the wording of refusals.

    Raises:
        ConfigError: the root is not a directory; ``writable_paths`` is a single string, or
            one of its entries is empty, contains NUL, or lies outside the root; the platform
            cannot open files relative to a directory without following symlinks
            (``O_NOFOLLOW``, ``dir_fd``), so paths could not be confined.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        writable_paths: Sequence[str | os.PathLike[str]] | None,
        texts: BuiltinTexts,
    ) -> None:
        if not _platform_confines():
            raise ConfigError(
                "workspace_tools: this platform cannot open files relative to a directory "
                "without following symlinks (O_NOFOLLOW, dir_fd), so the file tools could not "
                "keep paths inside the root; use them on Linux, macOS or a BSD"
            )
        real = os.path.realpath(os.fspath(root))
        if not os.path.isdir(real):
            raise ConfigError(
                f"workspace_tools: root {os.fspath(root)!r} is not an existing directory"
            )
        self.root = Path(real)
        # absolute paths (from the model, or in symlinks) may name the root either way
        self._bases = tuple(dict.fromkeys((real, os.path.abspath(os.fspath(root)))))
        self._texts = texts
        self._writable: tuple[re.Pattern[str], ...] | None = None
        self._excluded: tuple[re.Pattern[str], ...] = ()
        self._writable_names = ""
        if writable_paths is not None:
            if isinstance(writable_paths, str | os.PathLike):
                raise ConfigError(
                    "workspace_tools: writable_paths must be a list of paths, got the single "
                    f"path {os.fspath(writable_paths)!r}; write writable_paths=[...]"
                )
            entries = [os.fspath(p) for p in writable_paths]
            allowed = [e for e in entries if not e.startswith("!")]
            excluded = [e[1:] for e in entries if e.startswith("!")]
            self._excluded = tuple(self._writable_entry(e) for e in excluded)
            # Only exclusions: everything else is writable.
            allowed = allowed if allowed or not excluded else ["**"]
            self._writable = tuple(self._writable_entry(e) for e in allowed)
            self._writable_names = ", ".join(entries) if entries else texts.nothing_writable

    @property
    def writable_names(self) -> str | None:
        """The writable paths as the caller gave them, comma-separated; None if all of the
        root is writable."""
        return None if self._writable is None else self._writable_names

    def locate(self, path: str, *, write: bool = False, create: bool = False) -> Located:
        """Find ``path`` inside the root, walking it component by component from an open
        descriptor of the root (see the module docstring); the caller closes the result.

        ``path`` is relative to the root; an absolute path is accepted when it starts with the
        root (its real path, or the path it was given as). "" means the root itself. ``~`` is
        not expanded. A symlink inside the root is followed (by reading it) when its target
        stays inside: an absolute target must start with the root too, and a relative one may
        not climb above it. A missing last component gives ``st=None``; a missing directory
        before it, too (``name`` is then the rest of the path), unless ``create``.

        ``write`` checks the located path (after symlinks) against ``writable_paths``;
        ``create`` (with ``write``) makes missing parent directories, after that check.

        Raises:
            Refused: ``path`` contains NUL; it leads outside the root (through ``..``, an
                absolute path or a symlink; ``escape`` is set); it goes through more than 40
                symlinks; it is not writable; a parent is a file (with ``create``); the system
                refuses to open a directory on the way.
        """
        t = self._texts
        if "\x00" in path:
            raise Refused(t.path_nul.format(path=path))
        relative = self._within(path) if os.path.isabs(path) else path
        if relative is None:
            raise Refused(t.path_absolute.format(path=path), escape=True)
        normal = posixpath.normpath(relative or ".")
        # the refusal names '..' when the path text itself climbs out, else the symlink
        climbs = normal == ".." or normal.startswith("../")
        todo = relative.split("/")[::-1]  # a stack: the next component is last
        try:
            root_fd = os.open(self.root, _WALK_FLAGS)
        except OSError as exc:
            raise Refused(t.os_error.format(path=path, reason=exc.strerror or exc)) from None
        fds = [root_fd]  # the directories walked, all open: fds[i + 1] is names[i] in fds[i]
        names: list[str] = []
        links = 0  # symlinks followed, and components looked at again after a change

        def found(name: str, st: os.stat_result | None) -> Located:
            rel = "/".join([*names, name]) if name != "." else "/".join(names) or "."
            if write:
                self.check_writable(rel, path)
            return Located(fds.pop(), name, rel, st, path, t)

        def refused(exc: OSError) -> Refused:
            return Refused(t.os_error.format(path=path, reason=exc.strerror or exc))

        def lstat(part: str) -> os.stat_result | None:
            """The status of ``part`` in ``fds[-1]`` itself (a symlink is not followed);
            None when it does not exist."""
            try:
                return os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise refused(exc) from None

        try:
            while True:
                if links > _MAX_LINKS:
                    raise Refused(t.path_links.format(path=path))
                if not todo:  # the path names the directory reached
                    return found(".", os.fstat(fds[-1]))
                part = todo.pop()
                if part in ("", "."):
                    continue
                if part == "..":
                    if not names:
                        text = t.path_parent if climbs else t.path_symlink
                        raise Refused(text.format(path=path), escape=True)
                    os.close(fds.pop())
                    names.pop()
                    continue
                if not todo:  # the last component: looked at, not opened
                    st = lstat(part)
                    if st is None:
                        return found(part, None)
                    if stat.S_ISLNK(st.st_mode):
                        links += 1
                        self._follow(part, fds, names, todo, path)
                        continue
                    return found(part, st)
                try:
                    fds.append(os.open(part, _WALK_FLAGS, dir_fd=fds[-1]))
                except FileNotFoundError:
                    rest = self._missing(part, todo)
                    if rest is None:
                        continue  # the rest had "..", "." or "" in it: walk it again
                    if not create:
                        return found(rest, None)
                    if write:  # before making anything (and again at the end)
                        self.check_writable("/".join([*names, rest]), path)
                    try:
                        os.mkdir(part, dir_fd=fds[-1])
                    except FileExistsError:
                        pass  # made meanwhile: open it like any other
                    except OSError as exc:
                        raise refused(exc) from None
                    todo.append(part)
                    continue
                except OSError as exc:
                    if not isinstance(exc, NotADirectoryError) and exc.errno != _ELOOP:
                        raise refused(exc) from None
                    # a symlink or a file: O_NOFOLLOW | O_DIRECTORY refuses both
                    st = lstat(part)
                    if st is None or stat.S_ISDIR(st.st_mode):
                        links += 1  # gone, or a directory again, meanwhile: look again
                        todo.append(part)
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        links += 1
                        self._follow(part, fds, names, todo, path)
                        continue
                    if create:
                        raise Refused(t.parent_not_directory.format(path=path)) from None
                    return found("/".join([part, *reversed(todo)]), None)
                names.append(part)
        finally:
            for fd in fds:
                os.close(fd)

    def _within(self, absolute: str) -> str | None:
        """``absolute`` relative to the root ("" for the root) if it starts with the root (its
        real path or the path it was given as), else None."""
        for base in self._bases:
            if absolute == base:
                return ""
            prefix = base.rstrip("/") + "/"
            if absolute.startswith(prefix):
                return absolute[len(prefix) :]
        return None

    @staticmethod
    def _missing(part: str, todo: list[str]) -> str | None:
        """``part`` does not exist, so below it ``..`` can only undo names: the rest is read
        as text (like ``realpath``). Returns it, or None if that changed it (``todo`` is then
        the normalised rest, to walk again)."""
        rest = [part, *reversed(todo)]
        normal = posixpath.normpath("/".join(rest))
        if normal.split("/") == rest:
            return normal
        todo[:] = [] if normal == "." else normal.split("/")[::-1]
        return None

    def _follow(
        self, link: str, fds: list[int], names: list[str], todo: list[str], path: str
    ) -> None:
        """Put the target of the symlink ``link`` (in ``fds[-1]``) in front of ``todo``; an
        absolute target inside the root walks on from the root.

        Raises:
            Refused: the target leads outside the root.
        """
        try:
            target = os.readlink(link, dir_fd=fds[-1])
        except OSError:
            todo.append(link)  # no longer a symlink: look at it again
            return
        if os.path.isabs(target):
            relative = self._within(target)
            if relative is None:
                raise Refused(self._texts.path_symlink.format(path=path), escape=True)
            while len(fds) > 1:
                os.close(fds.pop())
            names.clear()
            target = relative
        todo.extend(target.split("/")[::-1])

    def check_writable(self, rel: str, path: str) -> None:
        """Refuse a write to ``rel`` (a located path relative to the root, symlinks resolved)
        outside ``writable_paths``.

        The located path is checked, so a symlink inside a writable directory cannot lead a
        write elsewhere in the root.

        Raises:
            Refused: ``rel`` is neither a writable path nor below one.
        """
        if not self.is_writable(rel):
            raise Refused(self._texts.not_writable.format(path=path, paths=self._writable_names))

    def is_writable(self, rel: str) -> bool:
        """May ``rel`` (relative to the root, "/"-separated) be written: it or a parent
        directory matches ``writable_paths`` and none matches an exclusion (always True
        without ``writable_paths``)."""
        if self._writable is None:
            return True
        candidates = [rel]
        while rel != ".":
            rel = posixpath.dirname(rel) or "."
            candidates.append(rel)
        return not any(rx.fullmatch(c) for rx in self._excluded for c in candidates) and any(
            rx.fullmatch(c) for rx in self._writable for c in candidates
        )

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
