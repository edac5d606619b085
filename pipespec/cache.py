"""Where pipespec keeps what it builds or measures once per machine: PIPESPEC_CACHE, else ~/.cache/pipespec.

Prepared models (`models/`), machine profiles (`profiles/`) and kernel choices (`kernels/`) live there.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """PIPESPEC_CACHE, else ~/.cache/pipespec."""
    return Path(os.environ.get("PIPESPEC_CACHE", Path.home() / ".cache" / "pipespec"))
