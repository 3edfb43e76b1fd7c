"""Mounts below a directory: finding them and taking them down, deepest first."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_MNT_DETACH = 2


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def table(mountinfo: str | None = None) -> list[tuple[Path, str]]:
    """(mount point, filesystem type) of every mount, in mount order."""
    text = MOUNTINFO.read_text() if mountinfo is None else mountinfo
    rows = []
    for line in text.splitlines():
        fields = line.split()
        rows.append((Path(_unescape(fields[4])), fields[fields.index("-") + 1]))
    return rows


def under(directory: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below `directory`, deepest first (so children go before parents)."""
    top = Path(str(directory).rstrip("/") or "/")
    points = {point for point, _ in table(mountinfo) if point == top or top in point.parents}
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def unmount_all(directory: Path) -> list[Path]:
    """Lazily unmounts everything below `directory` (a stacked mount may need several passes);
    returns the mount points that stayed."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):
        points = under(directory)
        if not points:
            return []
        for point in points:
            libc.umount2(os.fsencode(point), _MNT_DETACH)
    return under(directory)
