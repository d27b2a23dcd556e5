"""What a tier server is told at start: where its data lives and which engine to use.

Read from the command line and the environment (`A2M_<TIER>_URL`, `A2M_DATA`),
so the same image runs embedded on a laptop and against managed engines in a
cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class TierSettings:
    name: str  # the tier's name in describe, e.g. "working"
    data_dir: Path  # embedded engines keep their files here
    url: str | None = None  # an external engine (redis://, postgresql://, http://qdrant:6333); None = embedded
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific (e.g. procedural `review`, `remote`)
