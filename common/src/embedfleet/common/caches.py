"""Where embedfleet keeps what outlives a process on this machine (converted graphs, builds)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(*parts: str) -> Path:
    """$XDG_CACHE_HOME/embedfleet/<parts> (~/.cache without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "embedfleet", *parts)
