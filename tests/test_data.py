"""Tests of experiments.data: loaders, prompts, ROUGE and pass@1 (offline, CPU, < 60 s)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments.compose import load as load_conf
from experiments.data import (
    CodeExecutionWarning,
    DataError,
    DatasetPathError,
    EmptyDatasetError,
    HubOfflineError,
    PromptTooLongError,
    Sample,
    UnknownFieldError,
    build_check_program,
    build_prompt_ids,
    extract_code_block,
    load_dataset,
    pass_at_1,
    prompts_for,
    render_prompt_text,
    rouge_per_sample,
    rouge_scores,
    select_samples,
    truncate_at_stop,
)

CONFIG_NAMES = ("humaneval", "cnn_dailymail", "xsum", "news_lee_cnndm", "news_lee_xsum")

CNN_ROWS = [
    {"id": f"cnn{i}", "article": f"article number {i} about the cat .", "highlights": f"cat {i} ."}
    for i in range(5)
]
XSUM_ROWS = [
    {"id": f"{3000 + i}", "document": f"document {i} on the mat .", "summary": f"mat {i} ."}
    for i in range(4)
]


def dataset_cfg(name: str, **overrides) -> dict:
    cfg = load_conf("dataset", name)  # with its defaults (news_lee_* inherit their prompts)
    cfg.update(overrides)
    return cfg


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ------------------------------------------------------------------------- configs


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_files_are_plain_and_complete(name):
    cfg = dataset_cfg(name)
    assert cfg["name"] == name and "_target_" not in cfg
    for key in ("loader", "label", "task", "stand_in", "n_samples", "seed", "ids", "prompt"):
        assert key in cfg, key
    for family in ("base", "chat"):
        assert cfg["prompt"][family].count("{source}") == 1


@pytest.mark.parametrize("stand_in, original", [("news_lee_cnndm", "cnn_dailymail"),
                                                ("news_lee_xsum", "xsum")])
def test_stand_in_configs_reuse_the_original_prompts(stand_in, original):
    assert dataset_cfg(stand_in)["prompt"] == dataset_cfg(original)["prompt"]
    assert dataset_cfg(stand_in)["stand_in"] is True


# ------------------------------------------------------------------------- loaders


def test_humaneval_loads_164_problems_from_the_installed_package():
    dataset = load_dataset(dataset_cfg("humaneval"))
    assert len(dataset) == 164 and dataset.n_available == 164
    first = dataset[0]
    assert first.sample_id == "HumanEval/0"
    assert "def has_close_elements" in first.source
    assert first.reference and first.meta["entry_point"] == "has_close_elements"
    assert "def check" in first.meta["test"]
    assert first.stand_in is False and dataset.description()["task"] == "code"


def test_cnn_dailymail_loads_from_a_jsonl_file(tmp_path):
    path = write_jsonl(tmp_path / "cnn.jsonl", CNN_ROWS)
    dataset = load_dataset(dataset_cfg("cnn_dailymail", path=str(path), n_samples=3, seed=None))
    assert [s.sample_id for s in dataset] == ["cnn0", "cnn1", "cnn2"]
    assert dataset[1].source == CNN_ROWS[1]["article"]
    assert dataset[1].reference == CNN_ROWS[1]["highlights"]
    assert dataset[1].meta == {"dataset": "cnn_dailymail", "label": "CNN/DailyMail",
                               "stand_in": False}
    assert dataset.description()["origin"] == str(path)


def test_xsum_loads_from_a_save_to_disk_directory(tmp_path):
    import datasets

    datasets.Dataset.from_list(XSUM_ROWS).save_to_disk(str(tmp_path / "xsum_test"))
    dataset = load_dataset(dataset_cfg("xsum", path=str(tmp_path / "xsum_test"),
                                       n_samples=None, seed=None))
    assert [s.sample_id for s in dataset] == ["3000", "3001", "3002", "3003"]
    assert dataset[2].source == XSUM_ROWS[2]["document"]
    assert dataset[2].reference == XSUM_ROWS[2]["summary"]


def test_xsum_loads_from_a_directory_holding_split_jsonl(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", XSUM_ROWS)
    write_jsonl(tmp_path / "validation.jsonl", XSUM_ROWS[:1])
    dataset = load_dataset(dataset_cfg("xsum", path=str(tmp_path), n_samples=None, seed=None))
    assert len(dataset) == 4


@pytest.mark.parametrize("name", ["news_lee_cnndm", "news_lee_xsum"])
def test_news_lee_stand_in_has_350_unreferenced_articles(name):
    dataset = load_dataset(dataset_cfg(name, n_samples=None, seed=None))
    assert len(dataset) == 350
    assert len({s.sample_id for s in dataset}) == 350
    assert all(s.reference is None and s.stand_in for s in dataset)
    assert all(len(s.source.split()) > 40 for s in dataset)
    assert any("£" in s.source for s in dataset)  # Latin-1 byte decoded
    description = dataset.description()
    assert description["stand_in"] is True and description["has_references"] is False
    assert "stand-in" in description["label"]


def test_stand_in_flag_must_agree_with_loader():
    with pytest.raises(DataError, match="stand_in"):
        load_dataset(dataset_cfg("news_lee_xsum", stand_in=False))


@pytest.mark.parametrize("switch", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_hub_dataset_offline_fails_fast_naming_dataset_path(monkeypatch, switch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv(switch, "1")
    start = time.perf_counter()
    with pytest.raises(HubOfflineError, match=r"set dataset\.path") as error:
        load_dataset(dataset_cfg("cnn_dailymail"))
    assert time.perf_counter() - start < 1.0
    assert switch in str(error.value) and "\n" not in str(error.value)


def test_hub_dataset_online_calls_datasets_with_the_configured_names(monkeypatch):
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    calls = []

    def fake_load_dataset(hub_id, hub_config, split, revision):
        calls.append((hub_id, hub_config, split, revision))
        return datasets.Dataset.from_list(CNN_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = load_dataset(dataset_cfg("cnn_dailymail", n_samples=2, seed=None))
    assert calls == [("abisee/cnn_dailymail", "3.0.0", "test", None)]
    assert [s.reference for s in dataset] == ["cat 0 .", "cat 1 ."]
    assert dataset.description()["origin"] == "hf://abisee/cnn_dailymail/3.0.0[test]"


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetPathError, match=r"dataset\.path .* does not exist"):
        load_dataset(dataset_cfg("xsum", path=str(tmp_path / "nope.jsonl")))


def test_empty_dataset_is_a_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(EmptyDatasetError, match="no rows"):
        load_dataset(dataset_cfg("cnn_dailymail", path=str(path)))


def test_unknown_field_is_a_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "cnn.jsonl", CNN_ROWS)
    with pytest.raises(UnknownFieldError, match=r"dataset\.source_field='document'.*article"):
        load_dataset(dataset_cfg("cnn_dailymail", path=str(path), source_field="document"))


# ----------------------------------------------------------------------- selection

SAMPLES = [Sample(sample_id=f"s{i}", source=f"text {i}", reference=None) for i in range(20)]


def test_selection_without_seed_takes_the_first_n():
    assert [s.sample_id for s in select_samples(SAMPLES, n_samples=3)] == ["s0", "s1", "s2"]


def test_seeded_selection_is_deterministic_and_prefix_stable():
    five = select_samples(SAMPLES, n_samples=5, seed=7)
    assert five == select_samples(SAMPLES, n_samples=5, seed=7)
    assert select_samples(SAMPLES, n_samples=8, seed=7)[:5] == five
    assert five != select_samples(SAMPLES, n_samples=5, seed=8)
    assert five != SAMPLES[:5]


def test_selection_by_ids_keeps_the_given_order():
    chosen = select_samples(SAMPLES, n_samples=1, seed=3, ids=["s9", "s2"])
    assert [s.sample_id for s in chosen] == ["s9", "s2"]
    with pytest.raises(DataError, match="ids not in the dataset"):
        select_samples(SAMPLES, ids=["missing"])


def test_selection_larger_than_dataset_is_an_error():
    with pytest.raises(DataError, match="n_samples=21"):
        select_samples(SAMPLES, n_samples=21)


# ------------------------------------------------------------------------- prompts

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = "Article Summary Summarize One - Be brief the cat sat on mat dog ran following news " \
        "article in a few sentences one sentence : ."


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level tokenizer built offline; adds <s> like a Llama-style base tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=specials))
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def article_sample(n_words: int) -> Sample:
    words = ("the cat sat on the mat . " * n_words).split()[:n_words]
    return Sample(sample_id="a", source=" ".join(words), reference=None)


def test_base_prompt_renders_the_plain_template(tokenizer):
    prompt_cfg = dataset_cfg("cnn_dailymail")["prompt"]
    sample = article_sample(6)
    text = render_prompt_text(sample.source, prompt_cfg, tokenizer, "base")
    assert text == "Article: the cat sat on the mat\nSummary:"
    ids, truncated = build_prompt_ids(sample, prompt_cfg, tokenizer, "base", 512, 64)
    assert not truncated
    assert ids[0] == tokenizer.bos_token_id and ids == tokenizer(text)["input_ids"]


def test_xsum_base_prompt_asks_for_one_sentence(tokenizer):
    text = render_prompt_text("the dog ran", dataset_cfg("xsum")["prompt"], tokenizer, "base")
    assert "in one sentence" in text
    assert text.endswith("Article: the dog ran\nOne-sentence summary:")


def test_humaneval_base_prompt_is_the_stub_itself(tokenizer):
    stub = 'def f():\n    """Return one."""\n'
    assert render_prompt_text(stub, dataset_cfg("humaneval")["prompt"], tokenizer, "base") == stub


def test_chat_prompt_applies_the_chat_template(tokenizer):
    prompt_cfg = {**dataset_cfg("xsum")["prompt"], "system": "Be brief."}
    sample = article_sample(3)
    text = render_prompt_text(sample.source, prompt_cfg, tokenizer, "chat")
    assert text == (
        "<s><|system|>\nBe brief.\n<|user|>\nSummarize the following article in one sentence."
        "\n\nArticle: the cat sat\n<|assistant|>\n"
    )
    ids, truncated = build_prompt_ids(sample, prompt_cfg, tokenizer, "chat", 512, 64)
    assert not truncated
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1  # the template's BOS, not a second one


@pytest.mark.parametrize("family", ["base", "chat"])
def test_long_articles_are_cut_to_fit_context_minus_budget(tokenizer, family):
    prompt_cfg = dataset_cfg("cnn_dailymail")["prompt"]
    sample = article_sample(300)
    context_length, max_new_tokens = 64, 16
    ids, truncated = build_prompt_ids(
        sample, prompt_cfg, tokenizer, family, context_length, max_new_tokens
    )
    assert truncated
    assert len(ids) + max_new_tokens <= context_length
    assert len(ids) >= context_length - max_new_tokens - 1  # cut tight, not to nothing
    decoded = tokenizer.decode(ids)
    assert decoded.rstrip().endswith("Summary :" if family == "base" else "<|assistant|>")
    assert "Article :" in decoded


def test_prompt_that_cannot_fit_even_empty_is_an_error(tokenizer):
    prompt_cfg = dataset_cfg("xsum")["prompt"]
    with pytest.raises(PromptTooLongError, match="template alone"):
        build_prompt_ids(article_sample(50), prompt_cfg, tokenizer, "base", 20, 16)


def test_code_prompts_are_never_truncated(tokenizer):
    prompt_cfg = dataset_cfg("humaneval")["prompt"]
    with pytest.raises(PromptTooLongError, match="allow_truncation is false"):
        build_prompt_ids(article_sample(100), prompt_cfg, tokenizer, "base", 64, 16)


def test_prompts_for_builds_a_selections_prompts_with_their_samples(tokenizer):
    """The one way from a dataset config to prompt ids: the config's selection, or `count` samples of the
    whole selection after `offset` (fewer where it ends); each prompt with its sample, index and flag."""
    cfg = dataset_cfg("news_lee_cnndm", n_samples=3)
    found = prompts_for(cfg, tokenizer, "base", 512, 64)
    assert found.name == "news_lee_cnndm" and [p.index for p in found.prompts] == [0, 1, 2]
    assert [p.sample for p in found.prompts] == list(load_dataset(cfg).samples)
    first = found.prompts[0]
    assert (first.ids, first.truncated) == build_prompt_ids(first.sample, cfg["prompt"], tokenizer, "base", 512, 64)
    assert found.pairs() == [(p.sample_id, p.ids) for p in found.prompts] and found.ids() == [p.ids for p in found.prompts]
    sliced = prompts_for(cfg, tokenizer, "base", 512, 64, count=2, offset=4)  # n_samples ignored with count
    whole = load_dataset(dataset_cfg("news_lee_cnndm", n_samples=None)).samples
    assert [p.index for p in sliced.prompts] == [4, 5] and [p.sample for p in sliced.prompts] == list(whole[4:6])
    end = prompts_for(cfg, tokenizer, "base", None, 64, count=5, offset=len(whole) - 2)
    assert len(end.prompts) == 2 and not any(p.truncated for p in end.prompts)  # None: no context limit


def test_unknown_model_family_is_an_error(tokenizer):
    with pytest.raises(DataError, match="family"):
        render_prompt_text("x", dataset_cfg("xsum")["prompt"], tokenizer, "instruct")


# --------------------------------------------------------------------------- ROUGE


def test_rouge_matches_rouge_score_directly():
    from rouge_score import rouge_scorer

    predictions = ["Police killed the gunman in a shootout.", "Stocks rallied on Friday."]
    references = ["The gunman was shot dead by police.", "Shares rose sharply on Friday."]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    scores = rouge_scores(predictions, references)
    for name in ("rouge1", "rouge2", "rougeL"):
        mean = sum(e[name].fmeasure for e in expected) / 2
        assert scores[name] == pytest.approx(mean)
    assert rouge_per_sample(predictions, references)[0]["rouge1"] == expected[0]["rouge1"].fmeasure


def test_rouge_on_a_hand_checked_pair():
    # 5 of 6 unigrams shared; 3 of 5 bigrams shared; LCS "the cat on the mat" = 5 tokens.
    scores = rouge_scores(["the cat sat on the mat"], ["the cat lay on the mat"])
    assert scores == pytest.approx({"rouge1": 5 / 6, "rouge2": 3 / 5, "rougeL": 5 / 6})
    assert rouge_scores(["runs"], ["running"])["rouge1"] == 1.0  # Porter stemming is on


def test_rouge_refuses_missing_references():
    with pytest.raises(ValueError, match="stand-in"):
        rouge_scores(["a summary"], [None])


# -------------------------------------------------------------------------- pass@1


@pytest.fixture(scope="module")
def three_problems():
    return list(load_dataset(dataset_cfg("humaneval", n_samples=3)))


def test_pass_at_1_requires_explicit_opt_in(three_problems):
    with pytest.raises(PermissionError, match="allow_code_execution=True"):
        pass_at_1(three_problems, [p.reference for p in three_problems])


def test_pass_at_1_is_one_on_canonical_solutions(three_problems):
    with pytest.warns(CodeExecutionWarning, match="model-written code"):
        report = pass_at_1(three_problems, [p.reference for p in three_problems],
                           allow_code_execution=True)
    assert report["pass@1"] == 1.0 and report["n"] == 3 and report["n_passed"] == 3


def test_pass_at_1_is_zero_on_wrong_or_hanging_completions(three_problems):
    wrong = [
        "    return None\n",
        "    while True:\n        pass\n",
        "    import os\n    os.kill(1, 9)\n",
    ]
    with pytest.warns(CodeExecutionWarning):
        report = pass_at_1(three_problems, wrong, allow_code_execution=True, timeout_s=1.0)
    assert report["pass@1"] == 0.0
    assert [r["task_id"] for r in report["results"]] == [p.sample_id for p in three_problems]
    assert report["results"][1]["result"] == "timed out"
    assert report["results"][2]["result"].startswith("failed")  # os.kill is disabled


def test_chat_style_completion_in_a_code_block_passes(three_problems):
    problem = three_problems[0]
    answer = "Here it is:\n```python\n" + problem.source + problem.reference + "```\nDone."
    completion = extract_code_block(answer)
    assert "```" not in build_check_program(problem, completion)
    with pytest.warns(CodeExecutionWarning):
        assert pass_at_1([problem], [completion], allow_code_execution=True)["pass@1"] == 1.0


def test_base_completions_are_cut_at_stop_sequences():
    body = "    return 1\n"
    assert truncate_at_stop(body + "\ndef g():\n    pass\n") == body
    assert truncate_at_stop(body + "\nif __name__ == '__main__':\n    f()") == body
    assert truncate_at_stop(body) == body
