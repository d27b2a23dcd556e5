"""Records as Markdown files, and where in the repository each one lives.

A procedure is read by people in a code review as much as by agents, so the
file is what a person would write by hand: the content as the Markdown body,
the other fields in a YAML front-matter header.

Layout (chosen so `ls` of the repository reads like a knowledge base):

    shared/<key>.md              records of the `None` owner
    shared/_ids/<id>.md          ... and those without a key
    shared/_ids/_keys/<key>.md   ... and those whose key cannot be a path (encoded, as ids are)
    owners/<owner>/...           the same for a named owner (keys are unique per owner)

Owner names and ids are arbitrary strings, so they are percent-encoded into one
safe path segment (injective: `%` itself is encoded). On a file system that folds
case (macOS's default, Windows) that is not enough: `Alice` and `alice` would share
one directory. A repository created there records the `case-escaped` layout in
`LAYOUT_FILE`, and its segments also write an upper-case letter as `!` and the
letter (`Alice` -> `!alice`, as Go's module cache does), so no two fold together;
repositories without that file keep the first layout byte for byte. Keys are chosen by
callers to be readable paths, so a key that is a safe relative path is its own
file's path. A key that is not (`a//b`, `..`, `a\\b`, `.github/x`, `CON`: one that could
escape its owner's directory, clash with git's own files or a reserved name) is
percent-encoded, as an id is, into one file under `_ids/_keys/`: every key the
protocol accepts can be stored, so a record can move here from any other tier, and
keys that were paths before keep their files (decision 160).

Access statistics (`access_count`, `accessed_at`) are deliberately not in the
file: they change on every recall, and a procedure's diff should show only
changes someone made to it. The store keeps them in a sidecar inside `.git`.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable

import yaml

from a2m.records import DEFAULT_SALIENCE, Record
from backends.store import StoreRejected

SHARED_ROOT = "shared"
OWNERS_ROOT = "owners"
IDS_DIR = "_ids"
KEYS_DIR = "_keys"  # under IDS_DIR, where an id's file never is (ids are files `<encoded>.md`, never folders)
SUFFIX = ".md"
# Committed at the root (so a clone reads paths as the repository that wrote them): the layout's name.
LAYOUT_FILE = ".a2m-layout"
CASE_ESCAPED = "case-escaped"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BaseDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# Names Windows refuses as a file name with any extension: a reviewer may clone there.
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
)
_SAFE = re.compile(r"[A-Za-z0-9._@+-]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Code points HFS+ ignores in a name, so `.g\u200cit` is `.git` on a Mac (git's is_hfs_dotgit skips them).
_HFS_IGNORED = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")
MAX_SEGMENT_BYTES = 240  # leaves room for ".md" under the usual 255-byte name limit


class _FlowList(list):  # type: ignore[type-arg]
    """An embedding: one line in the header instead of hundreds."""


class _Dumper(_BaseDumper):  # type: ignore[misc, valid-type]
    pass


_Dumper.add_representer(
    _FlowList, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def encode_segment(text: str, *, escape_case: bool = False) -> str:
    """One filesystem-safe, injective path segment for an owner name or an id.

    `escape_case`: `A` is written `!a`, so the segment stays injective when case is folded (`!` is
    otherwise percent-encoded, and percent-encoding writes its hex digits upper-case only)."""
    if text == "":
        return "%"  # never produced otherwise: an encoded `%` is always followed by two hex digits
    out = []
    for i, char in enumerate(text):
        if escape_case and "A" <= char <= "Z":
            out.append("!" + char.lower())
        elif _SAFE.fullmatch(char) and not (i == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))
    encoded = "".join(out)
    if encoded.split(".")[0].lower() in _DEVICE_NAMES:
        encoded = f"%{ord(encoded[0]):02X}{encoded[1:]}"
    if len(encoded) > 200:
        # `~` is always encoded above, so a hashed name cannot equal a plain one.
        encoded = encoded[:150] + "~" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return encoded


def owner_root(owner: str | None) -> str:
    """The owner's directory in the first layout (a repository without `LAYOUT_FILE`)."""
    return Layout().owner_root(owner)


def fold(path: str) -> str:
    """`path` as a case-insensitive file system compares names: case-folded, normalisation-insensitive
    (APFS), without the code points HFS+ ignores. Two paths that fold alike are one file there."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", _HFS_IGNORED.sub("", path)).casefold())


def folding_clashes(held: Iterable[str], written: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Pairs of distinct paths that are one file where case folds, the earlier first: `held` in
    order, then each of `written` (a path in both counts as written)."""
    written = list(written)
    fresh = set(written)
    seen: dict[str, str] = {}
    clashes = []
    for path in [*(p for p in held if p not in fresh), *written]:
        other = seen.setdefault(fold(path), path)
        if other != path:
            clashes.append((other, path))
    return clashes


@dataclass(frozen=True, slots=True)
class Layout:
    """How one repository spells owners and ids in its paths (see the module's docstring)."""

    escape_case: bool = False

    @classmethod
    def parse(cls, text: str | None) -> "Layout":
        """The layout `LAYOUT_FILE` names (None: no such file, the first layout)."""
        if text is None:
            return cls()
        name = next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")), "")
        if name != CASE_ESCAPED:
            raise ValueError(f"unknown procedural layout {name!r} in {LAYOUT_FILE}")
        return cls(escape_case=True)

    def file(self) -> bytes:
        """What `LAYOUT_FILE` holds for this layout."""
        return (f"# a2m procedural layout: owner and id path segments write an upper-case letter as ! and the\n"
                f"# letter (Alice -> !alice), so a case-insensitive file system keeps them apart.\n"
                f"{CASE_ESCAPED}\n").encode()

    def owner_root(self, owner: str | None) -> str:
        return SHARED_ROOT if owner is None else f"{OWNERS_ROOT}/{encode_segment(owner, escape_case=self.escape_case)}"

    def path_for(self, owner: str | None, key: str | None, record_id: str) -> str:
        root = self.owner_root(owner)
        if key is None:
            return f"{root}/{IDS_DIR}/{encode_segment(record_id, escape_case=self.escape_case)}{SUFFIX}"
        if key_is_path(key):
            return f"{root}/{key}{SUFFIX}"
        return f"{root}/{IDS_DIR}/{KEYS_DIR}/{encode_segment(key, escape_case=self.escape_case)}{SUFFIX}"

    def record_path(self, record: Record) -> str:
        return self.path_for(record.owner, record.key, record.id)


def _names_git_dir(segment: str) -> bool:
    """Whether a segment is, or may be read as, `.git` somewhere: git refuses to check such a path out
    (`core.protectNTFS` is on by default on every platform, `protectHFS` on a Mac) and `git fsck` reports
    it (hasDotgit), so a committed one left a store whose next open could not reset its working tree."""
    folded = _HFS_IGNORED.sub("", segment).casefold()
    return folded.startswith(".git") or folded.startswith("git~1")


def key_is_path(key: str) -> bool:
    """Whether `key` can be its own file's path: relative, inside its owner's folder, clear of git's
    files, of names Windows reserves and of its own `.md` files. StoreRejected for a key no tier
    stores, which only an in-process caller can send: one with NUL (the protocol refuses it; git
    warns of a commit message holding it) or that is not valid Unicode (a lone surrogate)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreRejected("key is not valid Unicode") from None
    if "\x00" in key:
        raise StoreRejected("key must not contain NUL")
    if not key or "\\" in key or _CONTROL.search(key) or key.startswith("/"):
        return False
    segments = key.split("/")
    if segments[0] == IDS_DIR:
        return False
    return all(
        segment not in ("", ".", "..")
        and not _names_git_dir(segment)
        and segment.split(".")[0].casefold() not in _DEVICE_NAMES
        and len(segment.encode("utf-8")) <= MAX_SEGMENT_BYTES
        # `a` is the file a.md, so a folder a.md/ would clash with it
        and (position == len(segments) - 1 or not segment.casefold().endswith(SUFFIX))
        for position, segment in enumerate(segments)
    )


def path_for(owner: str | None, key: str | None, record_id: str) -> str:
    """The path in the first layout (a repository without `LAYOUT_FILE`)."""
    return Layout().path_for(owner, key, record_id)


# Header field order: identity first, then what a reviewer reads, then bookkeeping.
_HEADER_FIELDS = (
    "id", "key", "revision", "owner", "role", "session", "group", "tier",
    "salience", "uri", "media_type", "created_at", "metadata",
)


def dumps(record: Record, seq: int) -> bytes:
    """The file for `record`; `seq` is its insertion sequence (creation-order tie-break)."""
    header: dict[str, Any] = {}
    for name in _HEADER_FIELDS:
        value = getattr(record, name)
        if value is None or (name == "metadata" and not value):
            continue
        header[name] = value
    header["seq"] = seq
    if record.embedding is not None:
        header["embedding"] = _FlowList(record.embedding)
    try:
        text = _yaml(header)
        # One newline always ends the file (git and editors expect it); `loads` strips exactly one.
        return ("---\n" + text + "---\n" + record.content + "\n").encode("utf-8")
    except (yaml.YAMLError, UnicodeEncodeError) as exc:
        raise StoreRejected(f"record {record.id!r} cannot be stored as a file: {exc}") from None


def _yaml(header: dict[str, Any]) -> str:
    return yaml.dump(header, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def id_header(record_id: str) -> str | None:
    """How every file of the record `record_id` begins (the id is the header's first field), to find
    its files in git's history by text (`git log -S`); None for an id no file could hold."""
    try:
        return "---\n" + _yaml({"id": record_id})
    except (yaml.YAMLError, UnicodeEncodeError):
        return None


def loads(data: bytes) -> tuple[Record, int]:
    """Inverse of `dumps`: (record without access statistics, seq). ValueError if it is not one.

    Files can be committed by hand (a reviewer's edit), so anything a header can hold is refused
    this one way: broken YAML and fields of the wrong type too, which callers would otherwise
    each have to know."""
    try:
        return _loads(data)
    except (yaml.YAMLError, TypeError) as exc:
        raise ValueError(f"not a record file: {exc}") from None


def _loads(data: bytes) -> tuple[Record, int]:
    text = data.decode("utf-8")
    if not text.startswith("---\n"):
        raise ValueError("no front-matter header")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise ValueError("front-matter header is not closed")
    header = yaml.load(text[4 : end + 1], Loader=_Loader)
    if not isinstance(header, dict) or not isinstance(header.get("id"), str):
        raise ValueError("front-matter header has no id")
    body = text[end + 5 :]
    if body.endswith("\n"):
        body = body[:-1]
    seq = header.pop("seq", 0)
    embedding = header.pop("embedding", None)
    record = Record(
        id=header["id"],
        content=body,
        created_at=str(header.get("created_at", "")),
        role=header.get("role"),
        metadata=header.get("metadata") or {},
        group=header.get("group"),
        tier=header.get("tier"),
        salience=float(header.get("salience", DEFAULT_SALIENCE)),
        owner=header.get("owner"),
        session=header.get("session"),
        key=header.get("key"),
        revision=int(header.get("revision", 1)),
        embedding=None if embedding is None else [float(x) for x in embedding],
        uri=header.get("uri"),
        media_type=header.get("media_type"),
    )
    return record, int(seq)
