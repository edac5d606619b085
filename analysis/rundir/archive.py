"""Pack a finished sweep's traces into one archive, unpack them again, gzip a finished bench's runs.json.

    python -m analysis.rundir.archive pack SWEEP_DIR...       # each run's traces/ -> SWEEP_DIR/traces.tar.xz
    python -m analysis.rundir.archive unpack SWEEP_DIR...     # the archive -> each run's traces/ again
    python -m analysis.rundir.archive gzip-runs BENCH_DIR...  # BENCH_DIR/runs.json, BENCH_DIR/*/runs.json -> .gz

`pack` takes a sweep directory (members RUN/NNNNN.json) or a run directory (packed alone, NNNNN.json). It
refuses a run still being written (no summary.json) or a traces/ folder holding other files, merges an
archive already there, writes the archive atomically, reads every member back, and only then deletes the
loose files it packed. A trace gzip remakes byte for byte from its JSON (every one `RunStore` writes) is kept
as that JSON text, which xz compresses as one stream far better than gzip does file by file; any other as the
file's bytes. `unpack` writes every trace back as it was, checks it and deletes the archive (a sweep resumes
only with its traces loose). `gzip-runs` leaves runs.json.gz beside bench.json (`experiments.benchlib.
intervals` reads either). Readers find a trace in either place (`analysis.rundir.packed`); errors are one
line and exit status 2.
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import shutil
import struct
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Sequence

from analysis.rundir.errors import ResultsError
from analysis.rundir.packed import (ARCHIVE, TRACE_NAME, Member, archive_members, archives_of, clear_cache,
                                    member_names, read_archive)
from analysis.rundir.store import CONFIG, SAMPLES, SUMMARY, TRACES, atomic_write_bytes, is_run_dir

XZ_PRESET = 9 | lzma.PRESET_EXTREME
GZIP_LEVEL = 6  # RunStore's
RUNS = "runs.json"
BENCH = "bench.json"
COMMAND = "python -m analysis.rundir.archive"


def remade_gzip(text: bytes, mtime: int) -> bytes:
    """The trace file `RunStore` writes for `text` at `mtime` (what `unpack` writes for a JSON member)."""
    return gzip.compress(text, compresslevel=GZIP_LEVEL, mtime=mtime)


def as_member(path: Path) -> tuple[str, Member]:
    """A loose trace file as an archive member (name without its run): its JSON text where gzip remakes the
    file from it byte for byte, else the file's bytes."""
    data = path.read_bytes()
    if data[:4] == b"\x1f\x8b\x08\x00" and len(data) >= 18:
        mtime = struct.unpack("<I", data[4:8])[0]
        try:
            text = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            text = None
        if text is not None and mtime and remade_gzip(text, mtime) == data:
            return path.name[: -len(".gz")], Member(text, mtime)
    return path.name, Member(data, 0)


def as_file(name: str, member: Member) -> bytes:
    """The loose trace file of an archive member."""
    return member.data if name.endswith(".gz") else remade_gzip(member.data, member.mtime)


def tar_xz(members: dict[str, Member]) -> bytes:
    """The archive's bytes: a tar of the members in name order (owner, mode and mtime fixed), xz-compressed."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name].data), members[name].mtime, 0o644
            tar.addfile(info, io.BytesIO(members[name].data))
    return lzma.compress(buffer.getvalue(), format=lzma.FORMAT_XZ, preset=XZ_PRESET)


def run_dirs(directory: Path) -> list[tuple[Path, str]]:
    """(run directory, member prefix) of what `directory` packs: itself, or the run directories in it."""
    if is_run_dir(directory) or (directory / CONFIG).is_file():
        return [(directory, "")]
    children = sorted(c for c in directory.iterdir() if c.is_dir() and not c.name.startswith("."))
    return [(c, f"{c.name}/") for c in children if any((c / n).exists() for n in (SUMMARY, CONFIG, SAMPLES, TRACES))]


def loose_traces(run_dir: Path) -> list[Path]:
    """A finished run's loose trace files; a `ResultsError` for a run still being written or a foreign file."""
    folder = run_dir / TRACES
    if not is_run_dir(run_dir):
        raise ResultsError(f"{run_dir}: still being written (no {SUMMARY}): let its sweep finish (or resume it) "
                           "before packing")  # fmt: skip
    if not folder.is_dir():
        return []
    files = sorted(folder.iterdir())
    foreign = [f for f in files if not (f.is_file() and TRACE_NAME.match(f.name) and f.name.endswith(".gz"))]
    if foreign:
        raise ResultsError(f"{foreign[0]}: not a trace file: move it out of {folder} before packing")
    return files


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _merge(archive: Path, runs: list[tuple[Path, str]], quiet: bool) -> tuple[dict, list[tuple[Path, str]]]:
    """The members the new archive holds (those of an archive already there, and every loose trace) and the
    loose files they came from, each with its member's name."""
    members = dict(read_archive(archive)) if archive.is_file() else {}
    packed = []
    for number, (run_dir, prefix) in enumerate(runs, 1):
        files = loose_traces(run_dir)
        _say(f"[{number}/{len(runs)}] {run_dir}: {len(files)} traces", quiet)
        for path in files:
            name, member = as_member(path)
            name = prefix + name
            for other in member_names(int(TRACE_NAME.match(path.name).group(1)), prefix):
                if other in members and as_file(other, members[other]) != path.read_bytes():
                    raise ResultsError(f"{path}: differs from {archive}:{other}: unpack the archive ({COMMAND} "
                                       f"unpack {archive.parent}) and keep one of them")  # fmt: skip
                members.pop(other, None)
            members[name] = member
            packed.append((path, name))
    return members, packed


def pack(directory: str | Path, quiet: bool = False) -> tuple[int, int, int]:
    """Pack `directory`'s loose traces into its `ARCHIVE` (see the module); (traces packed, bytes the loose
    files took on disk, bytes of the archive)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ResultsError(f"{directory}: no such directory")
    runs = run_dirs(directory)
    if not runs:
        raise ResultsError(f"{directory}: no run directories to pack (a sweep or run directory holds them)")
    archive = directory / ARCHIVE
    members, packed = _merge(archive, runs, quiet)
    if not packed:
        _say(f"{directory}: no loose traces to pack", quiet)
        return 0, 0, archive.stat().st_size if archive.is_file() else 0
    atomic_write_bytes(archive, tar_xz(members))
    clear_cache()
    written = read_archive(archive)
    if written != members:
        raise ResultsError(f"{archive}: does not read back as written; the loose traces are kept")
    for path, name in packed:
        if as_file(name, written[name]) != path.read_bytes():
            raise ResultsError(f"{archive}: {name} does not read back as {path}; the loose traces are kept")
    loose_bytes = sum(path.stat().st_blocks * 512 for path, _ in packed)
    for path, _ in packed:
        path.unlink()
    for run_dir, _ in runs:
        if (run_dir / TRACES).is_dir() and not any((run_dir / TRACES).iterdir()):
            (run_dir / TRACES).rmdir()
    return len(packed), loose_bytes, archive.stat().st_size


def unpack(directory: str | Path, quiet: bool = False) -> int:
    """Write every trace of `directory`'s `ARCHIVE` back as its run's traces/NNNNN.json.gz, check each, then
    delete the archive; the number of traces written. A loose file already there must be the same."""
    directory = Path(directory)
    archive = directory / ARCHIVE
    if not archive.is_file():
        raise ResultsError(f"{archive}: no such archive: {directory} holds no packed traces")
    members = read_archive(archive)
    plan = []
    for name, member in sorted(members.items()):
        run_name, _, file_name = name.rpartition("/")
        match = TRACE_NAME.match(file_name)
        run_dir = directory / run_name if run_name else directory
        if match is None or not run_dir.is_dir():
            raise ResultsError(f"{archive}:{name}: not a trace of a run directory in {directory}")
        path, data = run_dir / TRACES / f"{match.group(1)}.json.gz", as_file(name, member)
        if path.exists() and path.read_bytes() != data:
            raise ResultsError(f"{path}: differs from {archive}:{name}: move one of them away, then unpack")
        plan.append((path, data))
    for number, (path, data) in enumerate(plan, 1):
        if not path.exists():
            atomic_write_bytes(path, data)
        if number % 500 == 0 or number == len(plan):
            _say(f"{archive}: {number}/{len(plan)} traces written", quiet)
    if any(path.read_bytes() != data for path, data in plan):
        raise ResultsError(f"{archive}: a trace written does not read back; the archive is kept")
    archive.unlink()
    clear_cache()
    return len(plan)


def copy_run(source: str | Path, target: str | Path) -> Path:
    """A copy of run directory `source` at `target` with every trace loose in traces/, wherever `source` keeps
    them (a tool or test that edits a committed run's traces starts from it)."""
    source, target = Path(source), Path(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(ARCHIVE))
    for archive, prefix in archives_of(source):
        for name, member in archive_members(archive).items():
            match = TRACE_NAME.match(name[len(prefix):]) if name.startswith(prefix) else None
            path = target / TRACES / f"{match.group(1)}.json.gz" if match else None
            if path is not None and not path.exists():
                atomic_write_bytes(path, as_file(name, member))
    return target


def gzip_runs(directory: str | Path, quiet: bool = False) -> int:
    """Replace a finished bench's runs.json (in `directory` and its folders) by runs.json.gz, each checked
    before the original goes; how many were gzipped."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ResultsError(f"{directory}: no such directory")
    found = sorted([*directory.glob(RUNS), *directory.glob(f"*/{RUNS}")])
    if not found and not [*directory.glob(f"{RUNS}.gz"), *directory.glob(f"*/{RUNS}.gz")]:
        raise ResultsError(f"{directory}: no {RUNS} here or in its folders (a bench run by python -m "
                           "experiments.bench writes one)")  # fmt: skip
    unfinished = [p for p in found if not (p.parent / BENCH).is_file()]
    if unfinished:
        raise ResultsError(f"{unfinished[0].parent}: still being written (no {BENCH}): let the bench finish first")
    for path in found:
        data, target = path.read_bytes(), path.with_name(f"{RUNS}.gz")
        if target.exists() and _gunzip(target) != data:
            raise ResultsError(f"{target}: differs from {path}: move one of them away, then gzip")
        if not target.exists():
            atomic_write_bytes(target, gzip.compress(data, compresslevel=9, mtime=0))
        if _gunzip(target) != data:
            raise ResultsError(f"{target}: does not read back as {path}; {path} is kept")
        path.unlink()
        _say(f"{path} -> {target.name}: {len(data)} -> {target.stat().st_size} bytes", quiet)
    return len(found)


def _gunzip(path: Path) -> bytes | None:
    try:
        return gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("pack", "sweep or run directories whose traces/ to pack into traces.tar.xz"),
                       ("unpack", "sweep or run directories whose traces.tar.xz to unpack into traces/"),
                       ("gzip-runs", "bench directories whose runs.json to gzip")):  # fmt: skip
        commands.add_parser(name, help=text).add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        for directory in args.dirs:
            print(_run(args.command, directory, args.quiet))
    except ResultsError as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {error.filename}: {error.strerror or error}", file=sys.stderr)
        return 2
    return 0


def _run(command: str, directory: Path, quiet: bool) -> str:
    """One directory's `command`, and the line that says what it did."""
    if command == "pack":
        count, before, after = pack(directory, quiet)
        loose, packed = f"{before / 1e6:.2f} MB on disk loose", f"{after / 1e6:.2f} MB"
        return f"{directory / ARCHIVE}: {count} traces packed ({loose}): {packed}"
    if command == "unpack":
        return f"{directory}: {unpack(directory, quiet)} traces unpacked into traces/"
    return f"{directory}: {gzip_runs(directory, quiet)} runs.json gzipped"

if __name__ == "__main__":
    sys.exit(main())
