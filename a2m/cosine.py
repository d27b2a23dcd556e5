"""A vector scaled to length 1 before an engine compares it by cosine, which does not depend on length.

Why: engines compute cosine in float32. The squares of a vector longer than
about 1.8e19 overflow there, and those of a very short one vanish, so a vector
every tier accepts (`records.validate_embedding`: elements within float32) lost
its direction and scored as orthogonal to every query (decision 38). Scaled in
float64 first, it keeps it. The procedural tier compares only unit vectors; the
semantic tier hands Qdrant one where Qdrant's own normalisation would fail.
"""

from __future__ import annotations

import math
import struct
from typing import Sequence

# Below this length a vector's largest element may lie in float32's subnormal range, where the float32 the
# tiers keep differs from the value by more than float32's rounding: such a vector is rounded first.
_SUBNORMAL_RISK = 2.0**-100


def unit_length(vector: Sequence[float]) -> list[float]:
    """`vector` scaled to length 1 in float64; a zero vector stays zero, and so does one whose elements
    float32 (what every tier keeps) flushes to zero. `math.hypot` scales internally: no overflow or
    underflow on the way."""
    length = math.hypot(*vector)
    if length < _SUBNORMAL_RISK:
        vector = struct.unpack(f"<{len(vector)}f", struct.pack(f"<{len(vector)}f", *vector))
        length = math.hypot(*vector)
    if not length:
        return [float(x) for x in vector]
    return [x / length for x in vector]
