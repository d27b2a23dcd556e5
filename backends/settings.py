"""What a tier server is told at start: where its data lives and which engine to use.

Read from the command line and the environment (`A2M_<TIER>_URL`, `A2M_DATA`),
so the same image runs embedded on a laptop and against managed engines in a
cluster. A setting the server could not start with is a `SettingsError`, raised
here (the name and data directory) or by `backends.serve.build` (the URL and
the engine options), before any engine starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SettingsError(SystemExit, ValueError):
    """A tier server's setting it refuses to start with; the message names the flag and the fix.

    A SystemExit, so `a2m serve` ends with the message alone (exit status 1, no traceback) whichever
    step finds it; a ValueError, so a caller building a server in-process can catch it as one."""

    def __str__(self) -> str:
        return str(self.code)


@dataclass(slots=True)
class TierSettings:
    name: str  # the tier's name in describe, e.g. "working"
    data_dir: Path  # embedded engines keep their files here
    url: str | None = None  # an external engine (redis://, postgresql://, http://qdrant:6333); None = embedded
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific (e.g. procedural `review`, `remote`)

    def __post_init__(self) -> None:
        # The name is also the data directory's last part (`a2m serve` puts it under --data).
        if not isinstance(self.name, str) or not self.name.strip() or self.name in (".", "..") or any(
                c in self.name for c in "/\\\x00"):
            raise SettingsError(f"--name must be a tier name (not empty, no '/', '\\', '.' or '..': it names the "
                                f"data directory under --data), got {self.name!r}")
        self.data_dir = Path(self.data_dir)
        # A file where the data directory (or a folder above it) should be: nothing could ever be kept there.
        for path in (self.data_dir, *self.data_dir.parents):
            try:
                if not path.exists():
                    continue
                is_dir = path.is_dir()
            except OSError:  # not ours to judge (no permission to look): the engine will say
                break
            if not is_dir:
                raise SettingsError(f"the data directory {self.data_dir} cannot be made: {path} is a file, "
                                    f"not a directory (--data / A2M_DATA names the folder that holds it)")
            break
