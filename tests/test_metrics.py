"""Quality metrics through evaluate's Metric API: the shipped ROUGE module, dataset.metric ids, offline.

The ROUGE numbers a run records must stay exactly rouge-score's; the shipped module loads from disk
with the hub switched off, and a metric id that is not available offline is one clear error at once.
"""

import sys
import time
import tomllib
from pathlib import Path

import pytest

from experiments.compose import load as load_conf
from experiments.compose import options
from experiments.data import load_dataset, rouge_per_sample, rouge_scores
from experiments.data.quality import (
    PASS_AT_1,
    ROUGE_TYPES,
    MetricError,
    load_metric,
    metric_scores,
    score_sample,
)
from experiments.metrics import METRICS_DIR, bundled_metric_path, bundled_metrics

ROOT = Path(__file__).resolve().parent.parent

# A user's own metric module, loaded by path like the shipped one.
EXACT_MATCH = '''
import datasets
import evaluate


class ExactMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="share of predictions equal to their reference", citation="", inputs_description="",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references):
        return {"exact_match": sum(p == r for p, r in zip(predictions, references)) / len(predictions), "note": "x"}
'''


@pytest.fixture(scope="module")
def news_pairs():
    """The news stand-in's articles as (prediction, reference) pairs: the lead sentence as the
    reference, the 40 words after it as the prediction (overlapping, so no score is trivially 0)."""
    cfg = {**load_conf("dataset", "news_lee_cnndm"), "n_samples": None}
    pairs = []
    for sample in load_dataset(cfg):
        lead, _, rest = sample.source.partition(". ")
        pairs.append((" ".join(rest.split()[:40]) or lead, lead))
    return pairs


@pytest.fixture(autouse=True)
def fresh_metric_cache():
    load_metric.cache_clear()
    yield
    load_metric.cache_clear()


# ---- ROUGE: the numbers rouge-score gives ------------------------------------------------------


def test_rouge_through_evaluate_equals_rouge_score_on_the_news_stand_in(news_pairs):
    from rouge_score import rouge_scorer

    predictions, references = [p for p, _ in news_pairs], [r for _, r in news_pairs]
    assert len(news_pairs) == 350
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    direct = [{name: s.fmeasure for name, s in scorer.score(ref, pred).items()} for pred, ref in news_pairs]
    assert rouge_per_sample(predictions, references) == direct  # exactly, sample by sample
    means = rouge_scores(predictions, references)
    assert means == {name: sum(d[name] for d in direct) / len(direct) for name in ROUGE_TYPES}
    assert 0 < means["rouge2"] < means["rouge1"] < 1
    metric = load_metric("rouge")
    assert metric.compute(predictions=predictions, references=references) == means  # the module's own mean
    assert [score_sample("rouge", p, r) for p, r in news_pairs[:5]] == direct[:5]


def test_the_shipped_rouge_takes_the_hubs_options(news_pairs):
    (prediction, reference), _ = news_pairs[:2]
    metric = load_metric("rouge")
    scores = metric.compute(predictions=[prediction], references=[reference], use_aggregator=False,
                            rouge_types=["rougeLsum"], use_stemmer=False)  # fmt: skip
    from rouge_score import rouge_scorer

    expected = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False).score(reference, prediction)
    assert scores == {"rougeLsum": [expected["rougeLsum"].fmeasure]}
    best = metric.compute(predictions=[prediction], references=[["unrelated words", reference]])
    assert best["rouge1"] == rouge_per_sample([prediction], [reference])[0]["rouge1"]  # the best reference counts


def test_the_rouge_module_is_an_evaluate_metric_loaded_from_the_repository():
    import evaluate

    assert bundled_metrics() == ["rouge"] and bundled_metric_path("rouge") == METRICS_DIR / "rouge"
    assert bundled_metric_path("bleu") is None
    metric = load_metric("rouge")
    assert isinstance(metric, evaluate.Metric) and type(metric).__name__ == "Rouge"
    assert load_metric("rouge") is metric  # loaded once per process
    direct = evaluate.load(str(METRICS_DIR / "rouge"), keep_in_memory=True)
    assert direct.compute(predictions=["the cat sat"], references=["the cat sat"])["rouge1"] == 1.0


def test_the_metric_module_ships_in_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "experiments.metrics" in setuptools["packages"]
    globs = setuptools["package-data"]["experiments.metrics"]
    shipped = {p.relative_to(METRICS_DIR) for pattern in globs for p in METRICS_DIR.glob(pattern)}
    assert Path("rouge/rouge.py") in shipped


# ---- dataset.metric ids ------------------------------------------------------------------------


def test_every_dataset_metric_is_available_offline():
    for name in options("dataset"):
        metric = load_conf("dataset", name).get("metric")
        if metric not in (None, PASS_AT_1):
            assert load_metric(metric) is not None, name


def test_a_local_metric_directory_is_any_evaluate_metric(tmp_path):
    module = tmp_path / "exact_match"
    module.mkdir()
    (module / "exact_match.py").write_text(EXACT_MATCH)
    assert metric_scores(str(module), ["a", "b"], ["a", "c"]) == {"exact_match": 0.5, "note": "x"}
    assert score_sample(str(module), "a", "a") == {"exact_match": 1.0}  # numbers only
    with pytest.raises(MetricError, match="cannot score these inputs"):
        metric_scores(str(module), ["a", "b"], ["a"])


def test_an_unknown_metric_offline_is_one_clear_error_at_once(monkeypatch):
    import evaluate.config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", False)  # evaluate's own switch unset
    for name in ("no_such_metric_anywhere", "someone/no-such-metric"):
        started = time.monotonic()
        with pytest.raises(MetricError) as caught:
            load_metric(name)
        assert time.monotonic() - started < 30  # evaluate alone would ask the hub, up to 100 s a request
        message = str(caught.value)
        assert message.startswith(f"dataset.metric={name!r}: no such metric offline") and "\n" not in message
        assert "not shipped with pipespec (rouge)" in message
    assert evaluate.config.HF_EVALUATE_OFFLINE is False  # switched on for the call only


def test_an_evaluate_id_goes_to_evaluate_when_online(monkeypatch):
    import evaluate

    calls = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(evaluate, "load", lambda path, **kwargs: calls.append((path, kwargs)) or "module")
    assert load_metric("bleu") == "module"
    assert load_metric("rouge") == "module"
    assert calls == [("bleu", {"keep_in_memory": True}), (str(METRICS_DIR / "rouge"), {"keep_in_memory": True})]


def test_pass_at_1_is_not_an_evaluate_metric():
    with pytest.raises(MetricError, match="executes code"):
        score_sample(PASS_AT_1, "def f(): pass", "")


def test_evaluate_is_not_imported_until_a_metric_is_used():
    import subprocess

    code = "import sys, experiments.data, experiments.export; print('evaluate' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
