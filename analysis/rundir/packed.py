"""Traces packed into one archive per sweep, read as if they were loose files.

A finished sweep's traces/NNNNN.json.gz files may be packed (`python -m analysis.rundir.archive pack`) into
`ARCHIVE` in the sweep directory, one member per trace: RUN/NNNNN.json (the trace's JSON text, the member's
mtime the gzip file's) or RUN/NNNNN.json.gz (the loose file's bytes, where gzip could not remake them
exactly). A run directory packed alone holds its own `ARCHIVE` with members NNNNN.json. A run's trace of
sample N is its loose file where there is one, else the member of the run's own archive, else that of its
sweep's (the parent directory's). An archive is decompressed once per process and kept in a small cache
(`MAX_CACHED_ARCHIVES`, `MAX_CACHED_BYTES`); a corrupt one is a one-line `ResultsError` naming it.
"""

from __future__ import annotations

import gzip
import io
import lzma
import re
import tarfile
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from analysis.rundir.errors import ResultsError

ARCHIVE = "traces.tar.xz"
MAX_CACHED_ARCHIVES = 16
MAX_CACHED_BYTES = 512 << 20  # decompressed bytes kept in all; the archive read last is always kept
TRACE_NAME = re.compile(r"^(\d{5,})\.json(\.gz)?$")  # a member's (or loose file's) name, without its run


class Member(NamedTuple):
    data: bytes
    mtime: int


_CACHE: OrderedDict[tuple, dict[str, Member]] = OrderedDict()


def member_names(index: int, prefix: str = "") -> tuple[str, str]:
    """The two names sample `index`'s trace may have in an archive: JSON text, then the gzip file's bytes."""
    stem = f"{prefix}{int(index):05d}"
    return f"{stem}.json", f"{stem}.json.gz"


def archives_of(run_dir: str | Path) -> list[tuple[Path, str]]:
    """(archive, member prefix) that may hold `run_dir`'s traces and exist: its own, then its sweep's."""
    run_dir = Path(run_dir)
    candidates = ((run_dir / ARCHIVE, ""), (run_dir.parent / ARCHIVE, f"{run_dir.name}/"))
    return [(archive, prefix) for archive, prefix in candidates if archive.is_file()]


def corrupt(archive: Path, reason: str) -> ResultsError:
    return ResultsError(f"{archive}: corrupt trace archive ({reason}); restore it (git checkout -- {archive}) "
                        f"or pack the loose traces again (python -m analysis.rundir.archive pack {archive.parent})")


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def read_archive(archive: Path) -> dict[str, Member]:
    """Every file member of `archive` (name -> data and mtime), decompressed now (no cache)."""
    try:
        data = lzma.decompress(archive.read_bytes())
    except FileNotFoundError:
        raise ResultsError(f"{archive}: missing") from None
    except OSError as error:
        raise ResultsError(f"{archive}: cannot read ({error.strerror or error})") from None
    except (lzma.LZMAError, EOFError) as error:
        raise corrupt(archive, f"not xz: {_first_line(error)}") from None
    members = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                handle = tar.extractfile(info) if info.isfile() else None
                if handle is not None:
                    members[info.name] = Member(handle.read(), int(info.mtime))
    except (tarfile.TarError, EOFError, OSError) as error:
        raise corrupt(archive, f"not a tar: {_first_line(error)}") from None
    return members


def archive_members(archive: Path) -> dict[str, Member]:
    """`read_archive`, once per process for an archive unchanged on disk (the cache is bounded)."""
    try:
        stat = archive.stat()
    except FileNotFoundError:
        raise ResultsError(f"{archive}: missing") from None
    key = (str(archive.resolve()), stat.st_mtime_ns, stat.st_size)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    members = read_archive(archive)
    _CACHE[key] = members
    while len(_CACHE) > 1 and (len(_CACHE) > MAX_CACHED_ARCHIVES or _cached_bytes() > MAX_CACHED_BYTES):
        _CACHE.popitem(last=False)
    return members


def _cached_bytes() -> int:
    return sum(len(m.data) for members in _CACHE.values() for m in members.values())


def clear_cache() -> None:
    _CACHE.clear()


def packed_trace(run_dir: str | Path, index: int) -> tuple[str, bytes] | None:
    """(where, JSON text) of sample `index`'s trace in an archive of `run_dir` (`archives_of`); None where
    none holds it. `where` names the archive and member, as error messages do."""
    for archive, prefix in archives_of(run_dir):
        members = archive_members(archive)
        text, packed_gzip = member_names(index, prefix)
        where = f"{archive}:{text if text in members else packed_gzip}"
        if text in members:
            return where, members[text].data
        if packed_gzip in members:
            try:
                return where, gzip.decompress(members[packed_gzip].data)
            except (OSError, EOFError, zlib.error):
                raise ResultsError(f"{where}: corrupt trace (not gzip JSON)") from None
    return None


def has_packed_trace(run_dir: str | Path, index: int) -> bool:
    return any(name in archive_members(archive) for archive, prefix in archives_of(run_dir)
               for name in member_names(index, prefix))  # fmt: skip


def has_packed_traces(run_dir: str | Path) -> bool:
    """Whether an archive of `run_dir` holds any of its traces."""
    for archive, prefix in archives_of(run_dir):
        for name in archive_members(archive):
            if name.startswith(prefix) and TRACE_NAME.match(name[len(prefix):]):
                return True
    return False
