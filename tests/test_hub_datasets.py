"""CNN/DailyMail and XSum from local copies in the hub's own formats, through the loader and through
`python -m experiments.run` (tiny models, ROUGE recorded): a `datasets` save_to_disk folder, the parquet files
of abisee/cnn_dailymail (3.0.0/test-00000-of-00001.parquet: article, highlights, id) and the hub's parquet
conversion of EdinburghNLP/xsum (refs/convert/parquet: default/test/0000.parquet: document, summary, id)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.compose import load as load_conf
from experiments.data import DatasetPathError, load_dataset

ROOT = Path(__file__).resolve().parent.parent
SLOW_FIXTURES = ("cnn_run", "xsum_run", "saved_run")  # a run of experiments.run each, in a subprocess

STORIES = [
    ("The city council voted on Tuesday to build a new bridge over the river, ending years of debate. "
     "Work starts in the spring and should take two years.", "Council approves new river bridge. Work starts in spring."),
    ("Heavy rain flooded several streets in the town centre overnight. Firefighters pumped water from "
     "basements and no one was hurt.", "Overnight rain floods town centre streets. No injuries reported."),
    ("The local football club signed a young striker from the second division. The coach said the "
     "player would start on Saturday.", "Club signs young striker, who starts on Saturday."),
    ("Scientists at the university found a new species of beetle in the forest north of the city. "
     "It is the first new species found there in fifty years.", "New beetle species found in forest near the city."),
]  # fmt: skip
CNN_ROWS = [{"article": a, "highlights": h, "id": f"{i:040x}"} for i, (a, h) in enumerate(STORIES)]
XSUM_ROWS = [{"document": a, "summary": h.split(".")[0] + ".", "id": str(30000000 + i)} for i, (a, h) in
             enumerate(STORIES)]  # fmt: skip
TRAIN_ROW = {"article": "A training article.", "highlights": "Training.", "id": "f" * 40}


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def cnn_snapshot(root: Path) -> Path:
    """abisee/cnn_dailymail's own layout: one folder per config, files SPLIT-0000N-of-0000M.parquet."""
    write_parquet(root / "3.0.0" / "test-00000-of-00001.parquet", CNN_ROWS)
    write_parquet(root / "3.0.0" / "train-00000-of-00001.parquet", [TRAIN_ROW])
    write_parquet(root / "1.0.0" / "test-00000-of-00001.parquet", [TRAIN_ROW])  # another config: not read
    (root / "README.md").write_text("---\nconfigs:\n- config_name: 3.0.0\n---\n")
    return root


def xsum_conversion(root: Path) -> Path:
    """EdinburghNLP/xsum's refs/convert/parquet branch: CONFIG/SPLIT/NNNN.parquet, config "default"."""
    write_parquet(root / "default" / "test" / "0000.parquet", XSUM_ROWS[:3])
    write_parquet(root / "default" / "test" / "0001.parquet", XSUM_ROWS[3:])
    write_parquet(root / "default" / "train" / "0000.parquet", [{"document": "d", "summary": "s", "id": "1"}])
    return root


def saved_to_disk(root: Path) -> Path:
    import datasets

    datasets.DatasetDict({"test": datasets.Dataset.from_list(CNN_ROWS),
                          "train": datasets.Dataset.from_list([TRAIN_ROW])}).save_to_disk(str(root))  # fmt: skip
    return root


def dataset_cfg(name: str, **overrides) -> dict:
    return {**load_conf("dataset", name), "n_samples": None, "seed": None, **overrides}


# ---- the loader -------------------------------------------------------------------------------------------


def test_cnn_dailymail_from_a_snapshot_of_the_hub_repository(tmp_path):
    root = cnn_snapshot(tmp_path / "cnn_dailymail")
    dataset = load_dataset(dataset_cfg("cnn_dailymail", path=str(root)))
    assert [s.sample_id for s in dataset] == [row["id"] for row in CNN_ROWS]  # test split of 3.0.0 only
    assert [s.reference for s in dataset] == [row["highlights"] for row in CNN_ROWS]
    assert dataset.description()["origin"] == str(root / "3.0.0" / "test-*.parquet")
    assert not dataset.stand_in and dataset.has_references
    # the config's folder, or its one file, are copies as good
    assert len(load_dataset(dataset_cfg("cnn_dailymail", path=str(root / "3.0.0")))) == len(CNN_ROWS)
    single = load_dataset(dataset_cfg("cnn_dailymail", path=str(root / "3.0.0" / "test-00000-of-00001.parquet")))
    assert [s.source for s in single] == [row["article"] for row in CNN_ROWS]


def test_xsum_from_the_hub_parquet_conversion(tmp_path):
    root = xsum_conversion(tmp_path / "xsum")
    dataset = load_dataset(dataset_cfg("xsum", path=str(root)))
    assert [s.sample_id for s in dataset] == [row["id"] for row in XSUM_ROWS]  # both shards, in order
    assert [s.reference for s in dataset] == [row["summary"] for row in XSUM_ROWS]
    assert dataset.description()["origin"] == str(root / "default" / "test" / "*.parquet")
    assert len(load_dataset(dataset_cfg("xsum", path=str(root / "default" / "test")))) == len(XSUM_ROWS)


def test_cnn_dailymail_from_save_to_disk(tmp_path):
    dataset = load_dataset(dataset_cfg("cnn_dailymail", path=str(saved_to_disk(tmp_path / "saved"))))
    assert [s.sample_id for s in dataset] == [row["id"] for row in CNN_ROWS]


def test_parquet_of_another_split_or_config_is_an_error_naming_both(tmp_path):
    root = cnn_snapshot(tmp_path / "cnn_dailymail")
    with pytest.raises(DatasetPathError, match=r"none of split 'validation' of config '3.0.0'.*dataset\.split"):
        load_dataset(dataset_cfg("cnn_dailymail", path=str(root), split="validation"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "test-0.parquet").write_text("not parquet")
    with pytest.raises(DatasetPathError, match="not a readable parquet file"):
        load_dataset(dataset_cfg("cnn_dailymail", path=str(tmp_path / "bad")))


def test_the_yamls_name_what_the_hub_serves():
    cnn, xsum = load_conf("dataset", "cnn_dailymail"), load_conf("dataset", "xsum")
    assert (cnn["hub_id"], cnn["hub_config"], cnn["hub_revision"]) == ("abisee/cnn_dailymail", "3.0.0", None)
    assert (cnn["source_field"], cnn["reference_field"], cnn["id_field"]) == ("article", "highlights", "id")
    # xsum's main revision holds only a loading script, which datasets>=4 does not run: its parquet conversion
    assert (xsum["hub_id"], xsum["hub_config"], xsum["hub_revision"]) == ("EdinburghNLP/xsum", None,
                                                                          "refs/convert/parquet")  # fmt: skip
    assert (xsum["source_field"], xsum["reference_field"], xsum["id_field"]) == ("document", "summary", "id")
    for name in ("news_lee_cnndm", "news_lee_xsum"):
        stand_in = load_conf("dataset", name)
        assert stand_in["stand_in"] is True and "stand-in" in stand_in["label"]


# ---- through the runner -----------------------------------------------------------------------------------


def run(tmp_path: Path, dataset: str, path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    command = [sys.executable, "-m", "experiments.run", "models=tiny_k2", "strategy=sd", "strategy.lookahead=2",
               f"dataset={dataset}", f"dataset.path={path}", "dataset.n_samples=3", "dataset.seed=null",
               "max_new_tokens=8", "run.warmup_tokens=0", "run.progress=false", "run.gpu_monitor=false",
               f"hydra.run.dir={out}", *extra]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done, out


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cnn")
    return run(tmp, "cnn_dailymail", cnn_snapshot(tmp / "cnn_dailymail"))


@pytest.fixture(scope="module")
def xsum_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xsum")
    return run(tmp, "xsum", xsum_conversion(tmp / "xsum"))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saved")
    return run(tmp, "cnn_dailymail", saved_to_disk(tmp / "saved"))


def check_summary(done: subprocess.CompletedProcess, out: Path, rows: list[dict], label: str) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_samples"] == 3 and summary["complete"]
    assert summary["dataset_label"] == label and not summary["stand_in"]
    assert set(summary["quality"]) == {"rouge1", "rouge2", "rougeL"}
    assert all(0.0 <= value <= 1.0 for value in summary["quality"].values())
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["sample_id"] for r in records] == [row["id"] for row in rows[:3]]
    assert all(set(r["quality"]) == {"rouge1", "rouge2", "rougeL"} for r in records)
    assert "quality: rouge1" in done.stdout  # the table printed at the end
    return summary


def test_cnn_dailymail_runs_through_the_runner_with_rouge(cnn_run):
    summary = check_summary(*cnn_run, CNN_ROWS, "CNN/DailyMail")
    assert summary["dataset_description"]["origin"].endswith(os.path.join("3.0.0", "test-*.parquet"))


def test_xsum_runs_through_the_runner_with_rouge(xsum_run):
    summary = check_summary(*xsum_run, XSUM_ROWS, "XSum")
    assert summary["dataset_description"]["origin"].endswith(os.path.join("default", "test", "*.parquet"))


def test_a_save_to_disk_copy_runs_through_the_runner(saved_run):
    summary = check_summary(*saved_run, CNN_ROWS, "CNN/DailyMail")
    assert summary["dataset_description"]["n_available"] == len(CNN_ROWS)  # the test split, not train


def test_a_hub_dataset_that_cannot_be_read_is_one_line(monkeypatch):
    import datasets

    from experiments.data import DataError

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'abisee/cnn_dailymail' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DataError) as error:
        load_dataset(dataset_cfg("cnn_dailymail"))
    message = str(error.value)
    assert "\n" not in message and message.startswith("cnn_dailymail: cannot read the hub dataset "
                                                      "hf://abisee/cnn_dailymail/3.0.0[test] (Couldn't reach")
    assert "set dataset.path to a local copy" in message


def test_another_splits_shards_are_never_read_as_the_split(tmp_path):
    write_parquet(tmp_path / "3.0.0" / "train-00000-of-00001.parquet", [TRAIN_ROW])
    with pytest.raises(DatasetPathError, match="none of split 'test'"):
        load_dataset(dataset_cfg("cnn_dailymail", path=str(tmp_path / "3.0.0")))
    write_parquet(tmp_path / "3.0.0" / "0000.parquet", CNN_ROWS)  # a split's own folder, shards by number
    assert len(load_dataset(dataset_cfg("cnn_dailymail", path=str(tmp_path / "3.0.0")))) == len(CNN_ROWS)
