"""Which paths of a working directory stay home: ``.gitignore`` files (nested, as git reads them), a
``.trainyardignore`` beside them, and ``.git/info/exclude``. Pure, apart from reading those files.

The CLI packs a directory with the ``ignore`` crate (ripgrep's walker), and a working directory's id is the
digest of what was packed, so this is a port of that crate's rules rather than of git's own code: the same
tree must make the same manifest whichever client packs it. The two agree on gitignore(5): ``#`` comments,
trailing spaces unless escaped, ``!`` to re-include, a leading or inner ``/`` anchoring a pattern to its
file's directory, a trailing ``/`` matching directories only, ``*`` and ``?`` stopping at ``/``, ``**`` as a
whole component, ``[...]`` classes (``[!...]``, ``[^...]``, ``[[:alpha:]]``), ``\\`` escapes; the last
matching line of a file wins; the nearest directory's file wins over those above; and nothing under an
ignored directory is looked at. Where the crate goes beyond git, so does this: ``{a,b}`` is an alternation
(git reads the braces literally), a line that does not parse as a glob (an unbalanced brace) is skipped, and
``.trainyardignore`` matches take precedence over ``.gitignore`` ones, and those over ``info/exclude``. Files
above the directory count within its repository only, as git's do (the CLI's ``rules.rs`` decides the same).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from enum import Enum

IGNORE_FILE = ".trainyardignore"
"""A file the user may list paths in, as in ``.gitignore``, to keep them out of a working directory."""


class Match(Enum):
    IGNORE = "ignore"
    WHITELIST = "whitelist"


# --- one pattern ------------------------------------------------------------------------------------------


class GlobError(ValueError):
    """A line that is not a glob (the crate skips it, and so do we)."""


@dataclass(frozen=True, slots=True)
class _Class:
    negated: bool
    ranges: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class _Alternates:
    branches: tuple[tuple[object, ...], ...]


# Tokens: a one-character str is a literal; these names are the rest.
_ANY, _STAR, _REC_PREFIX, _REC_SUFFIX, _REC_MIDDLE = "?any", "*star", "**/", "/**", "/**/"

_POSIX_CLASSES: dict[str, tuple[tuple[str, str], ...]] = {
    "alnum": (("0", "9"), ("A", "Z"), ("a", "z")),
    "alpha": (("A", "Z"), ("a", "z")),
    "blank": (("\t", "\t"), (" ", " ")),
    "cntrl": (("\x00", "\x1f"), ("\x7f", "\x7f")),
    "digit": (("0", "9"),),
    "graph": (("!", "~"),),
    "lower": (("a", "z"),),
    "print": ((" ", "~"),),
    "punct": (("!", "/"), (":", "@"), ("[", "`"), ("{", "~")),
    "space": (("\t", "\r"), (" ", " ")),
    "upper": (("A", "Z"),),
    "xdigit": (("0", "9"), ("A", "F"), ("a", "f")),
}
_MAX_ALTERNATES_DEPTH = 100


class _Parser:
    """globset's glob parser, with the options the gitignore builder sets: ``*`` and ``?`` do not match
    ``/``, ``\\`` escapes, an unclosed ``[`` is a literal."""

    def __init__(self, glob: str) -> None:
        self.glob = glob
        self.chars = glob
        self.at = 0
        self.prev: str | None = None
        self.cur: str | None = None
        self.branches: list[list[object]] = [[]]
        self.alternates: list[int] = []
        self.found_unclosed_class = False

    def bump(self) -> str | None:
        self.prev = self.cur
        self.cur = self.chars[self.at] if self.at < len(self.chars) else None
        if self.cur is not None:
            self.at += 1
        return self.cur

    def peek(self) -> str | None:
        return self.chars[self.at] if self.at < len(self.chars) else None

    def push(self, tok: object) -> None:
        self.branches[-1].append(tok)

    def parse(self) -> list[object]:
        while (c := self.bump()) is not None:
            if c == "?":
                self.push(_ANY)
            elif c == "*":
                self.star()
            elif c == "[" and not self.found_unclosed_class:
                self.klass()
            elif c == "{":
                if len(self.alternates) >= _MAX_ALTERNATES_DEPTH:
                    raise GlobError(f"{self.glob!r}: alternates nested too deep")
                self.alternates.append(len(self.branches))
                self.branches.append([])
            elif c == "}":
                if not self.alternates:
                    raise GlobError(f"{self.glob!r}: a '}}' with no '{{'")
                start = self.alternates.pop()
                alts = _Alternates(tuple(tuple(b) for b in self.branches[start:]))
                del self.branches[start:]
                self.push(alts)
            elif c == ",":
                if self.alternates:
                    self.branches.append([])
                else:
                    self.push(",")
            elif c == "\\":
                escaped = self.bump()
                if escaped is None:
                    raise GlobError(f"{self.glob!r}: a dangling '\\'")
                self.push(escaped)
            else:
                self.push(c)
        if len(self.branches) > 1:
            raise GlobError(f"{self.glob!r}: a '{{' with no '}}'")
        return self.branches[0]

    def star(self) -> None:
        prev = self.prev
        if self.peek() != "*":
            self.push(_STAR)
            return
        self.bump()
        if not self.branches[-1]:
            nxt = self.peek()
            if nxt is not None and nxt != "/":
                self.push(_STAR)
                self.push(_STAR)
            else:
                self.push(_REC_PREFIX)
                self.bump()
            return
        if prev != "/" and (len(self.branches) <= 1 or prev not in (",", "{")):
            self.push(_STAR)
            self.push(_STAR)
            return
        nxt = self.peek()
        if nxt is None:
            self.bump()
            is_suffix = True
        elif nxt in (",", "}") and len(self.branches) >= 2:
            is_suffix = True
        elif nxt == "/":
            self.bump()
            is_suffix = False
        else:
            self.push(_STAR)
            self.push(_STAR)
            return
        last = self.branches[-1].pop()
        if last in (_REC_PREFIX, _REC_SUFFIX):
            self.push(last)
        else:
            self.push(_REC_SUFFIX if is_suffix else _REC_MIDDLE)

    def klass(self) -> None:
        saved = (self.at, self.prev, self.cur)
        ranges: list[tuple[str, str]] = []
        negated = self.peek() in ("!", "^")
        if negated:
            self.bump()
        first, in_range = True, False
        while True:
            c = self.bump()
            if c is None:
                # Unclosed: the '[' is a literal, and so is every later one.
                self.at, self.prev, self.cur = saved
                self.found_unclosed_class = True
                self.push("[")
                return
            if c == "]" and not first:
                break
            if c == "]":
                ranges.append(("]", "]"))
            elif c == "-":
                if first:
                    ranges.append(("-", "-"))
                elif in_range:
                    self._extend(ranges, "-")
                    in_range = False
                else:
                    in_range = True
            elif c == "[" and not in_range and self.peek() == ":":
                posix = self._posix()
                ranges.extend(posix if posix is not None else (("[", "["),))
                in_range = False
            else:
                if in_range:
                    self._extend(ranges, c)
                else:
                    ranges.append((c, c))
                in_range = False
            first = False
        if in_range:
            ranges.append(("-", "-"))
        self.push(_Class(negated, tuple(ranges)))

    def _extend(self, ranges: list[tuple[str, str]], end: str) -> None:
        start = ranges[-1][0]
        if end < start:
            raise GlobError(f"{self.glob!r}: the range {start}-{end} is backwards")
        ranges[-1] = (start, end)

    def _posix(self) -> tuple[tuple[str, str], ...] | None:
        saved = (self.at, self.prev, self.cur)
        self.bump()  # the ':'
        name = ""
        while True:
            c = self.bump()
            if c == ":" and self.peek() == "]":
                self.bump()
                found = _POSIX_CLASSES.get(name)
                if found is None:
                    # globset gives up on the class here, as it does for a bad name.
                    return None
                return found
            if c is not None and "a" <= c <= "z" and len(name) < 8:
                name += c
                continue
            self.at, self.prev, self.cur = saved
            return None


def _literal(c: str) -> bytes:
    """A character as a bytes regex matching its UTF-8 bytes (each escaped, as globset does)."""
    return b"".join(bytes([b]) if chr(b).isalnum() and b < 0x80 else b"\\x%02x" % b for b in c.encode())


def _regex(tokens: list[object] | tuple[object, ...]) -> bytes:
    out = bytearray()
    for tok in tokens:
        if isinstance(tok, _Class):
            ranges = tok.ranges
            if not tok.negated:
                # A class never matches the separator.
                kept: list[tuple[str, str]] = []
                for lo, hi in ranges:
                    if lo > "/" or hi < "/":
                        kept.append((lo, hi))
                    elif lo == hi == "/":
                        pass
                    elif lo == "/":
                        kept.append(("0", hi))
                    elif hi == "/":
                        kept.append((lo, "."))
                    else:
                        kept += [(lo, "."), ("0", hi)]
                ranges = tuple(kept)
            if not ranges:
                out += rb"[^\s\S]"
                continue
            out += b"[^/" if tok.negated else b"["
            for lo, hi in ranges:
                out += _literal(lo) if lo == hi else _literal(lo) + b"-" + _literal(hi)
            out += b"]"
        elif isinstance(tok, _Alternates):
            parts = [_regex(b) for b in tok.branches]
            parts = [p for p in parts if p]
            if parts:
                out += b"(?:" + b"|".join(parts) + b")"
        elif tok == _ANY:
            out += b"[^/]"
        elif tok == _STAR:
            out += b"[^/]*"
        elif tok == _REC_PREFIX:
            out += b"(?:/?|.*/)"
        elif tok == _REC_SUFFIX:
            out += b"/.*"
        elif tok == _REC_MIDDLE:
            out += b"(?:/|/.*/)"
        else:
            assert isinstance(tok, str) and len(tok) == 1, f"a literal token is one character: {tok!r}"
            out += _literal(tok)
    return bytes(out)


def glob_regex(glob: str) -> re.Pattern[bytes]:
    """A glob (as globset reads it for gitignore) as a regex over a path's bytes."""
    tokens = _Parser(glob).parse()
    if tokens == [_REC_PREFIX]:
        return re.compile(rb".*\Z", re.DOTALL)
    return re.compile(_regex(tokens) + rb"\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Pattern:
    """One line of an ignore file."""

    line: str
    regex: re.Pattern[bytes]
    whitelist: bool
    only_dir: bool


def _trim_trailing_spaces(line: str) -> str:
    last_space: int | None = None
    i = 0
    while i < len(line):
        if line[i] == "\\":
            if i + 1 >= len(line):
                return line
            i += 2
            last_space = None
        elif line[i] == " ":
            if last_space is None:
                last_space = i
            i += 1
        else:
            last_space = None
            i += 1
    return line if last_space is None else line[:last_space]


def parse_line(line: str) -> Pattern | None:
    """A line of an ignore file as a pattern; ``None`` for a comment, a blank line or one that is no glob."""
    original = line
    if line.startswith("#"):
        return None
    line = _trim_trailing_spaces(line)
    if not line:
        return None
    whitelist = only_dir = anchored = False
    if line.startswith(("\\!", "\\#")):
        line = line[1:]
        anchored = line.startswith("/")
    else:
        if line.startswith("!"):
            whitelist = True
            line = line[1:]
        if line.startswith("/"):
            line = line[1:]
            anchored = True
    if not line:
        return None
    if line.endswith("/"):
        only_dir = True
        line = line[:-1]
        if line.endswith("\\"):
            line = line[:-1]
    glob = line
    # No slash: it matches at any depth.
    if not anchored and "/" not in line and not (glob.startswith("**/") or glob == "**"):
        glob = "**/" + glob
    # `dir/**` matches what is inside, not the directory itself.
    if glob.endswith("/**"):
        glob += "/*"
    try:
        regex = glob_regex(glob)
    except GlobError:
        return None
    return Pattern(original, regex, whitelist, only_dir)


@dataclass(frozen=True, slots=True)
class IgnoreFile:
    """One ignore file's patterns, matched against paths relative to its directory."""

    patterns: tuple[Pattern, ...] = ()

    @classmethod
    def read(cls, path: bytes) -> IgnoreFile:
        """The file's patterns; none when it cannot be read. A line that is not UTF-8 is skipped."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return cls()
        return cls.parse(data)

    @classmethod
    def parse(cls, data: bytes) -> IgnoreFile:
        raw_lines = data.split(b"\n")
        if raw_lines and raw_lines[-1] == b"":
            raw_lines.pop()
        patterns = []
        for i, raw in enumerate(raw_lines):
            try:
                line = raw.removesuffix(b"\r").decode("utf-8")
            except UnicodeDecodeError:
                continue
            if i == 0:
                line = line.lstrip("\ufeff")
            p = parse_line(line)
            if p is not None:
                patterns.append(p)
        return cls(tuple(patterns))

    def match(self, rel: bytes, is_dir: bool) -> Match | None:
        """The last pattern that matches ``rel`` (a ``/``-separated path relative to the file's directory)."""
        for p in reversed(self.patterns):
            if (is_dir or not p.only_dir) and p.regex.match(rel):
                return Match.WHITELIST if p.whitelist else Match.IGNORE
        return None


# --- a directory's rules ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DirRules:
    """The ignore files of one directory: its ``.trainyardignore``, ``.gitignore`` and, where it holds a
    ``.git``, that repository's ``info/exclude``. ``parts``: the directory, as path parts from the point its
    paths are matched from."""

    parts: tuple[bytes, ...]
    custom: IgnoreFile = field(default_factory=IgnoreFile)
    gitignore: IgnoreFile = field(default_factory=IgnoreFile)
    exclude: IgnoreFile = field(default_factory=IgnoreFile)

    @classmethod
    def read(cls, directory: bytes, parts: tuple[bytes, ...]) -> DirRules:
        exclude = IgnoreFile()
        git = os.path.join(directory, b".git")
        if os.path.lexists(git):
            common = _git_common_dir(git)
            if common is not None:
                exclude = IgnoreFile.read(os.path.join(common, b"info", b"exclude"))
        return cls(
            parts,
            IgnoreFile.read(os.path.join(directory, IGNORE_FILE.encode())),
            IgnoreFile.read(os.path.join(directory, b".gitignore")),
            exclude,
        )


def _git_common_dir(git: bytes) -> bytes | None:
    """The repository directory a ``.git`` stands for: itself, or for a worktree's ``.git`` file (``gitdir:
    PATH``) the common directory its ``commondir`` names."""
    if not os.path.isfile(git):
        return git
    try:
        with open(git, "rb") as f:
            first = f.readline().rstrip(b"\n").removesuffix(b"\r")
        if not first.startswith(b"gitdir: "):
            return None
        real = first[len(b"gitdir: ") :]
        with open(os.path.join(real, b"commondir"), "rb") as f:
            common = f.readline().rstrip(b"\n").removesuffix(b"\r")
    except OSError:
        return None
    return os.path.join(real, common) if common.startswith(b".") else common


class Rules:
    """The rules an entry is matched against: those of the directories from the packed one down to the
    entry's parent, then those of the directories above the packed one within its repository."""

    def __init__(self, above: list[DirRules], inside: list[DirRules]) -> None:
        self._above = above  # nearest first, parts from the file system's root
        self._inside = inside  # packed directory first, parts from it

    @classmethod
    def above(cls, real_root: bytes) -> Rules:
        """The rules of the directories above ``real_root`` (an absolute path with no links) within its git
        repository: up to the nearest directory with a ``.git`` (``real_root`` itself: none), none when there
        is no such directory. A ``.gitignore`` above the repository (a home directory's) is not the project's."""
        parts = tuple(p for p in real_root.split(b"/") if p)

        def path(n: int) -> bytes:
            return b"/" + b"/".join(parts[:n])

        top = next((n for n in range(len(parts), -1, -1) if os.path.lexists(os.path.join(path(n), b".git"))), None)
        if top is None or top == len(parts):
            return cls([], [])
        above = [DirRules.read(path(n), parts[:n]) for n in range(len(parts) - 1, top - 1, -1)]
        return cls(above, [])

    def enter(self, directory: bytes, parts: tuple[bytes, ...]) -> Rules:
        """These rules with those of ``directory`` (at ``parts`` inside the packed one) added."""
        return Rules(self._above, [*self._inside, DirRules.read(directory, parts)])

    def ignored(self, rel: tuple[bytes, ...], is_dir: bool, root_parts: tuple[bytes, ...]) -> bool:
        """Whether the entry at ``rel`` (parts inside the packed directory, whose own parts from ``/`` are
        ``root_parts``) stays home."""
        found: dict[str, Match] = {}
        for kind in ("custom", "gitignore", "exclude"):
            for d in reversed(self._inside):
                m = getattr(d, kind).match(b"/".join(rel[len(d.parts) :]), is_dir)
                if m is not None:
                    found[kind] = m
                    break
            if kind in found:
                continue
            full = root_parts + rel
            for d in self._above:
                m = getattr(d, kind).match(b"/".join(full[len(d.parts) :]), is_dir)
                if m is not None:
                    found[kind] = m
                    break
        for kind in ("custom", "gitignore", "exclude"):
            if kind in found:
                return found[kind] is Match.IGNORE
        return False
