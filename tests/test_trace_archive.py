"""A finished sweep's traces packed into one archive read exactly as the loose files did, unpack back byte for
byte, and every refusal and corruption is one line (`analysis.rundir.archive`, `analysis.rundir.packed`); a
bench's runs.json gzipped reads the same (`experiments.benchlib.intervals`)."""

import gzip
import json
import lzma
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.fit import measure_run
from analysis.rundir import ResultsError, has_trace, read_records, read_trace
from analysis.rundir.archive import main as archive_main
from analysis.rundir.packed import ARCHIVE, clear_cache, read_archive
from analysis.runs import find_runs, load_run

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "results_tiny"


@pytest.fixture
def sweep(tmp_path):
    """Three finished runs in one folder; 1_sd_L2's traces as `RunStore` writes them (gzip level 6, an mtime),
    the others as the fixture holds them (gzip files with a name in their header: packed as they are)."""
    out = tmp_path / "sweep"
    shutil.copytree(FIXTURE, out)
    for path in sorted((out / "1_sd_L2" / "traces").glob("*.json.gz")):
        path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), compresslevel=6, mtime=1_765_000_000))
    clear_cache()
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.json.gz"))}


def _everything_read(folder: Path) -> dict:
    """Every trace as read_trace and Run.traces give it, Run.has_traces, the fit's measurement and the
    Spec-Bench answers of every run below `folder`."""
    from experiments.export import export_specbench

    runs = find_runs(folder)
    read = {}
    for run in runs:
        read[run.path.name] = {
            "has_traces": run.has_traces(),
            "read_trace": [read_trace(run.path, r["index"]) for r in run.samples],
            "stage_traces": [[t.to_dict() for t in run.traces(i)] for i in range(len(run.samples))],
            "measure_run": repr(measure_run(run)),
        }
    read["specbench"] = {name: m["answers"] for name, m in export_specbench([str(folder)], tstamp=0.0).items()}
    return read


def _one_line_error(capsys, *words):
    """The command's last stderr line is its one error line (progress lines may come before it)."""
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in "".join(lines), lines
    assert all(word in errors[0] for word in words), errors


def test_a_packed_sweep_reads_as_its_loose_traces_and_unpacks_byte_for_byte(sweep, capsys):
    files, before = _files(sweep), _everything_read(sweep)
    assert len(files) == 6 and all(entry["has_traces"] for name, entry in before.items() if name != "specbench")
    assert archive_main(["pack", str(sweep)]) == 0
    assert "6 traces packed" in capsys.readouterr().out
    assert _files(sweep) == {} and not list(sweep.rglob("traces")) and (sweep / ARCHIVE).is_file()
    members = read_archive(sweep / ARCHIVE)
    assert sorted(members) == ["0_greedy/00000.json.gz", "0_greedy/00001.json.gz", "1_sd_L2/00000.json",
                               "1_sd_L2/00001.json", "2_pipespec_L0/00000.json.gz", "2_pipespec_L0/00001.json.gz"]
    assert members["1_sd_L2/00000.json"].data == gzip.decompress(files["1_sd_L2/traces/00000.json.gz"])
    assert (sweep / ARCHIVE).stat().st_size < sum(map(len, files.values()))
    clear_cache()
    assert _everything_read(sweep) == before
    assert all(has_trace(sweep / name, 1) for name in ("0_greedy", "1_sd_L2")) and not has_trace(sweep / "0_greedy", 7)
    archive = (sweep / ARCHIVE).read_bytes()
    assert archive_main(["unpack", str(sweep)]) == 0
    assert _files(sweep) == files and not (sweep / ARCHIVE).exists()
    assert archive_main(["--quiet", "pack", str(sweep)]) == 0
    assert (sweep / ARCHIVE).read_bytes() == archive  # the same traces make the same archive


def test_a_run_packed_alone_and_a_trace_added_after_packing(sweep, capsys):
    run = sweep / "1_sd_L2"
    expected = [read_trace(run, i) for i in (0, 1)]
    assert archive_main(["pack", str(run)]) == 0
    assert sorted(read_archive(run / ARCHIVE)) == ["00000.json", "00001.json"] and not (run / "traces").exists()
    assert [read_trace(run, i) for i in (0, 1)] == expected and load_run(run).has_traces()
    with pytest.raises(ResultsError, match=r"00005.json.gz: missing \(and not in .*traces.tar.xz\)") as info:
        read_trace(run, 5)
    assert "\n" not in str(info.value)
    # a trace written loose after packing (a resumed run) is read beside the archive, and packed into it next time
    (run / "traces").mkdir()
    (run / "traces" / "00005.json.gz").write_bytes(gzip.compress(json.dumps(expected[0]).encode(), 6, mtime=1))
    assert read_trace(run, 5) == expected[0] and read_trace(run, 1) == expected[1]
    assert archive_main(["pack", str(run)]) == 0
    assert sorted(read_archive(run / ARCHIVE)) == ["00000.json", "00001.json", "00005.json"]
    assert archive_main(["pack", str(run)]) == 0 and "0 traces packed" in capsys.readouterr().out
    # a loose trace that differs from the archive's is never dropped
    (run / "traces").mkdir()
    (run / "traces" / "00001.json.gz").write_bytes(gzip.compress(b'{"stages": [1]}', mtime=1))
    assert archive_main(["pack", str(run)]) == 2
    _one_line_error(capsys, "00001.json.gz: differs from", "unpack")
    assert archive_main(["unpack", str(run)]) == 2
    _one_line_error(capsys, "00001.json.gz: differs from")
    assert (run / "traces" / "00001.json.gz").is_file() and (run / ARCHIVE).is_file()


def test_a_packed_run_copies_with_its_traces_loose(sweep, tmp_path):
    from analysis.rundir.archive import copy_run

    files = _files(sweep / "1_sd_L2")
    assert archive_main(["--quiet", "pack", str(sweep)]) == 0
    copy = copy_run(sweep / "1_sd_L2", tmp_path / "copy" / "1_sd_L2")
    assert _files(copy) == files and not (tmp_path / "copy" / ARCHIVE).exists()
    assert (copy / "summary.json").read_bytes() == (sweep / "1_sd_L2" / "summary.json").read_bytes()


def test_a_corrupt_archive_is_one_line(sweep, capsys):
    assert archive_main(["--quiet", "pack", str(sweep)]) == 0
    good = (sweep / ARCHIVE).read_bytes()
    for damage, reason in ((good[: len(good) // 2], "not xz"), (b"garbage", "not xz"),
                           (lzma.compress(b"not a tar at all" * 40), "not a tar")):
        (sweep / ARCHIVE).write_bytes(damage)
        clear_cache()
        with pytest.raises(ResultsError, match=f"traces.tar.xz: corrupt trace archive \\({reason}") as info:
            read_trace(sweep / "0_greedy", 0)
        assert "\n" not in str(info.value) and "git checkout --" in str(info.value)
        with pytest.raises(ResultsError, match="corrupt trace archive"):
            load_run(sweep / "1_sd_L2").has_traces()
        assert archive_main(["unpack", str(sweep)]) == 2
        _one_line_error(capsys, "corrupt trace archive")
    done = subprocess.run([sys.executable, "-m", "analysis.rundir.archive", "unpack", str(sweep)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert (sweep / ARCHIVE).is_file() and not list(sweep.rglob("*.json.gz"))


def test_a_corrupt_member_reads_as_a_corrupt_loose_file_did(sweep):
    (sweep / "0_greedy" / "traces" / "00001.json.gz").write_bytes(b"\x1f\x8b truncated")
    (sweep / "1_sd_L2" / "traces" / "00001.json.gz").write_bytes(gzip.compress(b"{not json", 6, mtime=5))
    assert archive_main(["--quiet", "pack", str(sweep)]) == 0
    with pytest.raises(ResultsError, match=r"traces.tar.xz:0_greedy/00001.json.gz: corrupt trace \(not gzip JSON\)"):
        read_trace(sweep / "0_greedy", 1)
    with pytest.raises(ResultsError, match=r"traces.tar.xz:1_sd_L2/00001.json: corrupt trace \(not JSON\)"):
        read_trace(sweep / "1_sd_L2", 1)
    assert archive_main(["--quiet", "unpack", str(sweep)]) == 0
    assert (sweep / "0_greedy" / "traces" / "00001.json.gz").read_bytes() == b"\x1f\x8b truncated"


def test_pack_refuses_a_run_still_being_written_and_a_foreign_file(sweep, capsys):
    files = _files(sweep)
    (sweep / "2_pipespec_L0" / "summary.json").unlink()
    assert archive_main(["pack", str(sweep)]) == 2
    _one_line_error(capsys, "2_pipespec_L0: still being written (no summary.json)")
    shutil.copy(FIXTURE / "2_pipespec_L0" / "summary.json", sweep / "2_pipespec_L0" / "summary.json")
    (sweep / "0_greedy" / "traces" / ".00002.json.gz.x1.tmp").write_bytes(b"half")
    assert archive_main(["pack", str(sweep)]) == 2
    _one_line_error(capsys, ".00002.json.gz.x1.tmp: not a trace file")
    assert _files(sweep) == files and not (sweep / ARCHIVE).exists()
    for command in ("pack", "unpack"):
        assert archive_main([command, str(sweep / "missing")]) == 2
        _one_line_error(capsys, "missing")


def test_a_packed_sweep_resumes_only_unpacked(sweep):
    from experiments.sweep import check_run_dir, check_unpacked
    from pipespec.errors import ConfigError

    assert archive_main(["--quiet", "pack", str(sweep)]) == 0
    with pytest.raises(ConfigError, match=re.escape(f"python -m analysis.rundir.archive unpack {sweep} restores")) \
            as info:
        check_run_dir({"resume": True}, sweep)
    assert "\n" not in str(info.value)
    assert archive_main(["--quiet", "unpack", str(sweep)]) == 0
    check_unpacked(sweep)
    assert all(read_records(sweep / name)[0] for name in ("0_greedy", "1_sd_L2", "2_pipespec_L0"))


def test_a_gzipped_runs_json_reads_as_the_runs_json(tmp_path, capsys):
    from experiments.benchlib.intervals import main as intervals_main
    from experiments.benchlib.intervals import read_runs

    records = [{"system": name, "repetition": rep, "prompt": p, "tokens": [1] * 8, "time_s": s * (1 + p / 10)}
               for name, s in (("hf_greedy", 1.0), ("sd", 0.5)) for p in range(3) for rep in range(2)]
    bench = tmp_path / "bench" / "humaneval"
    bench.mkdir(parents=True)
    (bench / "runs.json").write_text(json.dumps(records))
    assert archive_main(["gzip-runs", str(tmp_path / "bench")]) == 2
    _one_line_error(capsys, "still being written (no bench.json)")
    assert intervals_main([str(bench)]) == 0
    table = capsys.readouterr().out
    (bench / "bench.json").write_text("{}")
    assert archive_main(["gzip-runs", str(tmp_path / "bench")]) == 0
    assert not (bench / "runs.json").exists() and (bench / "runs.json.gz").is_file()
    assert read_runs(bench) == records and gzip.decompress((bench / "runs.json.gz").read_bytes()) == json.dumps(
        records).encode()
    capsys.readouterr()
    assert intervals_main([str(bench)]) == 0 and capsys.readouterr().out == table
    (bench / "runs.json.gz").write_bytes(b"\x1f\x8b broken")
    assert intervals_main([str(bench)]) == 2
    _one_line_error(capsys, "cannot read its runs")
    assert archive_main(["gzip-runs", str(tmp_path / "empty")]) == 2
    _one_line_error(capsys, "no such directory")
