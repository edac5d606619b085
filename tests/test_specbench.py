"""Spec-Bench in and out: its question file as a dataset, our runs as its answer files, its figures.

The round trip runs greedy and pipespec on the tiny k=2 hierarchy over a question file written in
Spec-Bench's format, exports both, and checks every exported number against Spec-Bench's
definitions (evaluation/speed.py, evaluation/eval.py) computed here from the run's own files.
"""

import gzip
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.rundir import ResultsError
from analysis.specbench import (
    answer_line,
    speed_figures,
    speed_report,
    target_accept_lengths,
)
from experiments.compose import load as load_conf
from experiments.data import DataError, load_dataset
from experiments.data.loaders import QuestionFormatError
from experiments.data.spec_bench import (
    history_answer,
    record_fields,
    sample_turns,
    turn_prompt_ids,
    turn_prompt_text,
)
from experiments.export import export_specbench, main as export_main

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_specbench")
SLOW_FIXTURES = ('sweep',)  # a Spec-Bench sweep: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent
MAX_NEW_TOKENS = 16


def words(rng: random.Random, n: int) -> str:
    """Text of the tiny word-level vocabulary (t2 ... t255; t1 is its EOS)."""
    return " ".join(f"t{rng.randrange(2, 256)}" for _ in range(n))


def spec_bench_questions() -> list[dict]:
    """Questions shaped as Spec-Bench's data/spec_bench/question.jsonl: MT-bench ones with two turns,
    single-turn ones, references a list per turn (rag: a list of answers)."""
    rng = random.Random(0)
    return [
        {"question_id": 81, "category": "writing", "turns": [words(rng, 12), words(rng, 6)]},
        {"question_id": 111, "category": "math", "turns": [words(rng, 10), words(rng, 5)], "reference": ["t5", "t6"]},
        {"question_id": 161, "category": "translation", "turns": [words(rng, 14)], "reference": [words(rng, 5)]},
        {"question_id": 241, "category": "summarization", "turns": [words(rng, 30)], "reference": [words(rng, 8)]},
        {"question_id": 321, "category": "qa", "turns": [words(rng, 9)]},
        {"question_id": 481, "category": "rag", "turns": [words(rng, 20)], "reference": [[words(rng, 3), "t9"]]},
    ]


def write_questions(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def spec_bench_cfg(path: Path, **overrides) -> dict:
    return {**load_conf("dataset", "spec_bench"), "path": str(path), **overrides}


def run_cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", *args, "run.progress=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def questions(tmp_path_factory) -> Path:
    return write_questions(tmp_path_factory.mktemp("spec_bench") / "question.jsonl", spec_bench_questions())


@pytest.fixture(scope="module")
def sweep(questions, tmp_path_factory) -> Path:
    """greedy and pipespec on tiny_k2 over every question (the two-turn ones turn by turn)."""
    sweep = tmp_path_factory.mktemp("sweep")
    result = run_cli(
        "-m", "models=tiny_k2", "strategy=greedy,pipespec", "dataset=spec_bench", f"dataset.path={questions}",
        "dataset.n_samples=null", f"max_new_tokens={MAX_NEW_TOKENS}", "strategy.lookahead=2",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep


def run_dir(sweep: Path, strategy: str) -> Path:
    (found,) = [p for p in sweep.iterdir() if p.is_dir() and f"_{strategy}_" in p.name]
    return found


def records_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def turn_steps(run: Path, record: dict) -> list[dict]:
    """The target's step columns of each turn of a record, read straight from the trace file."""
    trace = json.loads(gzip.decompress((run / "traces" / f"{record['index']:05d}.json.gz").read_bytes()))
    return [turn["stages"][-1]["steps"] for turn in trace.get("turns") or [trace]]


def turns_of(record: dict) -> list[dict]:
    """A record's turns (a one-turn question is its own one turn)."""
    return record.get("turns") or [record]


def kept_lengths(steps: dict, new_tokens: int) -> list[int]:
    """Spec-Bench's accept lengths of one generation: accepted + 1 per target forward pass, the last
    ones cut so they add up to the tokens kept (as its PLD runner cuts tokens past an EOS)."""
    lengths = [a + 1 for k, a in zip(steps["kind"], steps["accepted"]) if k in ("verify", "single")]
    while sum(lengths) > new_tokens:
        lengths[-1] -= min(lengths[-1], sum(lengths) - new_tokens)
        lengths = lengths if lengths[-1] else lengths[:-1]
    return lengths


def read_answers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- the round trip -------------------------------------------------------------------------


def test_export_writes_spec_bench_answers_that_match_the_traces(sweep, questions, tmp_path):
    out = tmp_path / "answers"
    done = subprocess.run([sys.executable, "-m", "experiments.export", "specbench", str(sweep), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["tiny_k2-greedy.jsonl", "tiny_k2-pipespec-L2.jsonl"]
    asked = {row["question_id"]: row for row in spec_bench_questions()}
    for strategy, name in (("greedy", "tiny_k2-greedy"), ("pipespec", "tiny_k2-pipespec-L2")):
        run = run_dir(sweep, strategy)
        answers = read_answers(out / f"{name}.jsonl")
        assert [a["question_id"] for a in answers] == sorted(asked)  # reorg_answer_file's order
        by_id = {int(r["sample_id"]): r for r in records_of(run)}
        for answer in answers:
            record = by_id[answer["question_id"]]
            assert set(answer) == {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
            assert answer["category"] == asked[answer["question_id"]]["category"] and answer["model_id"] == name
            (choice,) = answer["choices"]
            turns = turns_of(record)
            assert len(turns) == len(asked[answer["question_id"]]["turns"])  # every turn ran
            assert choice["index"] == 0 and choice["turns"] == [t["output_text"].strip() for t in turns]
            assert choice["new_tokens"] == [t["new_tokens"] for t in turns]
            assert choice["wall_time"] == [t["time_s"] for t in turns]
            per_turn = turn_steps(run, record)
            assert choice["decoding_steps"] == [sum(k in ("verify", "single") for k in st["kind"]) for st in per_turn]
            assert choice["accept_lengths"] == [n for st, t in zip(per_turn, turns)
                                                for n in kept_lengths(st, t["new_tokens"])]  # fmt: skip
            assert sum(choice["accept_lengths"]) == record["new_tokens"]  # what was kept, as Spec-Bench's sums
            if strategy == "greedy":  # as Spec-Bench's inference_baseline writes it
                assert choice["accept_lengths"] == [1] * record["new_tokens"]
                assert choice["decoding_steps"] == [t["new_tokens"] for t in turns]
        if strategy == "pipespec":
            assert max(length for a in answers for length in a["choices"][0]["accept_lengths"]) > 1
    assert "tiny_k2-pipespec-L2: 6 answers" in done.stdout and "speedups against tiny_k2-greedy" in done.stdout


def test_figures_are_spec_bench_definitions_computed_from_the_runs(sweep):
    greedy, pipespec = run_dir(sweep, "greedy"), run_dir(sweep, "pipespec")
    methods = export_specbench([str(sweep)], tstamp=0.0)
    report = {row["task"]: row for row in methods["tiny_k2-pipespec-L2"]["report"]}
    assert list(report) == ["mt_bench", "translation", "summarization", "qa", "rag", "overall"]

    # speed.py: per-question tokens / seconds, their mean; speedup = mean / baseline mean; accept lengths pooled
    def rates(run):
        return [r["new_tokens"] / r["time_s"] for r in records_of(run)]

    mine, base = rates(pipespec), rates(greedy)
    lengths = [n for r in records_of(pipespec)
               for st, t in zip(turn_steps(pipespec, r), turns_of(r)) for n in kept_lengths(st, t["new_tokens"])]
    overall = report["overall"]
    assert overall["n"] == 6
    assert overall["tokens_per_s"] == pytest.approx(sum(mine) / len(mine))
    assert overall["baseline_tokens_per_s"] == pytest.approx(sum(base) / len(base))
    assert overall["speedup"] == pytest.approx((sum(mine) / len(mine)) / (sum(base) / len(base)))
    assert overall["mean_accepted_tokens"] == pytest.approx(sum(lengths) / len(lengths))
    # pipespec's own figures: pooled, as summary.json has them
    summary = json.loads((pipespec / "summary.json").read_text())
    greedy_summary = json.loads((greedy / "summary.json").read_text())
    assert overall["tokens_per_s_pooled"] == pytest.approx(summary["tokens_per_s"])
    assert overall["speedup_pooled"] == pytest.approx(summary["tokens_per_s"] / greedy_summary["tokens_per_s"])
    mt = [r for r in records_of(pipespec) if int(r["sample_id"]) in (81, 111)]
    assert report["mt_bench"]["n"] == 2
    assert report["mt_bench"]["tokens_per_s"] == pytest.approx(sum(r["new_tokens"] / r["time_s"] for r in mt) / 2)
    assert {row["task"]: row["speedup"] for row in methods["tiny_k2-greedy"]["report"]}["overall"] == 1.0


def test_export_to_one_file_takes_one_method(sweep, tmp_path, capsys):
    out = tmp_path / "pipespec.jsonl"
    assert export_main(["specbench", str(run_dir(sweep, "pipespec")), "--out", str(out)]) == 0
    assert len(read_answers(out)) == 6
    assert "no greedy run given" in capsys.readouterr().out
    both = tmp_path / "both.jsonl"
    assert export_main(["specbench", str(sweep), "--out", str(both)]) == 2
    assert "2 methods" in capsys.readouterr().err and not both.exists()


# ---- bad inputs: one line each, nothing written ----------------------------------------------


def test_a_run_without_traces_is_one_error_and_writes_nothing(sweep, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(run_dir(sweep, "pipespec"), broken)
    (broken / "traces" / "00002.json.gz").unlink()
    out = tmp_path / "out.jsonl"
    out.write_text("old answers\n")
    assert export_main(["specbench", str(broken), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no trace" in err and "00002.json.gz" in err and err.count("\n") == 1
    assert out.read_text() == "old answers\n"  # untouched
    shutil.rmtree(broken / "traces")
    assert export_main(["specbench", str(broken), "--out", str(tmp_path / "new")]) == 2
    assert "no trace" in capsys.readouterr().err and not (tmp_path / "new").exists()


@pytest.mark.parametrize("args, message", [([], "no run directories given"), (["NOT_A_RUN"], "not a pipespec run")])
def test_no_runs_or_a_foreign_path_is_one_error(args, message, tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("hello")
    argv = ["specbench", *[str(foreign) if a == "NOT_A_RUN" else a for a in args], "--out", str(tmp_path / "o")]
    assert export_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "broken, override, message",
    [(False, "dataset.categories=[summarization,cooking]", "unknown ['cooking']"),
     (True, "dataset.categories=null", "line 2: missing field 'turns'")],
)  # fmt: skip
def test_bad_questions_are_one_line_errors_and_write_no_results(broken, override, message, questions, tmp_path,
                                                                 entry_point):  # fmt: skip
    rows = spec_bench_questions()
    del rows[1]["turns"]
    path = write_questions(tmp_path / "broken.jsonl", rows) if broken else questions
    run = tmp_path / "run"
    result = entry_point("experiments.run", "models=tiny_k2", "strategy=greedy", "dataset=spec_bench",
                         f"dataset.path={path}", override, f"hydra.run.dir={run}", "run.progress=false")  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and message in result.stderr and result.stderr.count("\n") == 1
    assert not (run / "samples.jsonl").exists() and not (run / "summary.json").exists()


# ---- the question file ----------------------------------------------------------------------


def test_questions_load_with_their_turns_categories_and_references(questions):
    dataset = load_dataset(spec_bench_cfg(questions))
    assert [s.sample_id for s in dataset] == ["81", "111", "161", "241", "321", "481"]
    writing, math, translation = dataset[0], dataset[1], dataset[2]
    assert sample_turns(writing) == tuple(spec_bench_questions()[0]["turns"])
    assert writing.source == writing.meta["turns"][0]
    assert record_fields(math) == {"question_id": 111, "category": "math"}
    assert math.reference == "t5" and math.meta["references"] == ("t5", "t6")
    assert translation.reference == spec_bench_questions()[2]["reference"][0]
    assert dataset[5].reference is None and dataset[5].meta["references"][0][1] == "t9"  # rag: answers list
    assert dataset.task == "chat" and not dataset.stand_in


def test_categories_select_questions_in_file_order(questions):
    picked = load_dataset(spec_bench_cfg(questions, categories=["summarization", "math", "writing"]))
    assert [s.sample_id for s in picked] == ["81", "111", "241"]
    assert [s.sample_id for s in load_dataset(spec_bench_cfg(questions, categories="qa"))] == ["321"]


@pytest.mark.parametrize(
    "edit, message",
    [(lambda r: r.pop("category"), "line 3: missing field 'category'"),
     (lambda r: r.pop("question_id"), "line 3: missing field 'question_id'"),
     (lambda r: r.update(turns="just text"), "line 3: field 'turns' must be a non-empty list of strings"),
     (lambda r: r.update(turns=[]), "line 3: field 'turns' must be a non-empty list"),
     (lambda r: r.update(reference="x"), "line 3: field 'reference' must be a list"),
     (lambda r: r.update(question_id=81), "line 3: question_id 81 repeats line 1")],
)  # fmt: skip
def test_a_malformed_question_names_its_line_and_field(edit, message, tmp_path):
    rows = spec_bench_questions()
    edit(rows[2])
    with pytest.raises(QuestionFormatError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_dataset(spec_bench_cfg(write_questions(tmp_path / "q.jsonl", rows)))


def test_not_json_unknown_category_and_no_source_are_clear_errors(questions, tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(spec_bench_questions()[0]) + "\n\n{not json\n")
    with pytest.raises(DataError, match="line 3: not JSON"):
        load_dataset(spec_bench_cfg(bad))
    with pytest.raises(DataError, match=r"dataset.categories: unknown \['cooking'\]; .* has \['writing', 'math'"):
        load_dataset(spec_bench_cfg(questions, categories=["cooking"]))
    with pytest.raises(DataError, match="set dataset.path to Spec-Bench's data/spec_bench/question.jsonl"):
        load_dataset({**load_conf("dataset", "spec_bench")})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="unavailable offline .* set dataset.path"):
        load_dataset({**load_conf("dataset", "spec_bench"), "hub_id": "someone/spec-bench"})


def test_a_hub_copy_is_read_through_datasets_when_online(monkeypatch):
    import datasets

    rows = spec_bench_questions()
    calls = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: calls.append((args, kwargs)) or rows)
    cfg = {**load_conf("dataset", "spec_bench"), "hub_id": "someone/spec-bench", "categories": ["qa"]}
    dataset = load_dataset(cfg)
    assert [s.sample_id for s in dataset] == ["321"] and dataset.origin == "hf://someone/spec-bench[train]"
    assert calls == [(("someone/spec-bench", None), {"split": "train", "revision": None})]


# ---- multi-turn prompts and answers --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from experiments.tiny import make_tokenizer

    tokenizer = make_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tokenizer


def test_turn_prompts_carry_the_earlier_turns_and_answers(questions, tiny_tokenizer):
    sample = load_dataset(spec_bench_cfg(questions))[0]
    first, second = sample_turns(sample)
    base = {"base": "USER: {source}\nASSISTANT:", "chat": "Q: {source}", "system": None}
    assert turn_prompt_text(sample, 0, [], base, tiny_tokenizer, "base") == f"USER: {first}\nASSISTANT:"
    assert turn_prompt_text(sample, 1, ["t7 t8"], base, tiny_tokenizer, "base") == (
        f"USER: {first}\nASSISTANT: t7 t8\nUSER: {second}\nASSISTANT:"
    )
    chat = turn_prompt_text(sample, 1, ["t7 t8"], {**base, "system": "t3"}, tiny_tokenizer, "chat")
    assert chat == f"<system> t3 <user> Q: {first} <assistant> t7 t8 <user> Q: {second} <assistant>"
    from experiments.data import build_prompt_ids

    assert turn_prompt_ids(sample, 0, [], base, tiny_tokenizer, "base", 512, 16) == build_prompt_ids(
        sample, base, tiny_tokenizer, "base", 512, 16
    )
    ids, truncated = turn_prompt_ids(sample, 1, ["t7 t8"], base, tiny_tokenizer, "base", 512, 16)
    text = turn_prompt_text(sample, 1, ["t7 t8"], base, tiny_tokenizer, "base")
    assert not truncated and ids == tiny_tokenizer(text)["input_ids"]
    with pytest.raises(DataError, match="turn 1 needs the 1 earlier answer"):
        turn_prompt_text(sample, 1, [], base, tiny_tokenizer, "base")
    with pytest.raises(DataError, match="has 2 turn"):
        turn_prompt_text(sample, 2, ["a", "b"], base, tiny_tokenizer, "base")
    with pytest.raises(DataError, match="turn 1: prompt of .* exceeds context_length=30"):
        turn_prompt_ids(sample, 1, ["t7 " * 20], base, tiny_tokenizer, "base", 30, 4)
    assert history_answer("  t5 t6\n") == "t5 t6"


def test_a_two_turn_conversation_exports_one_entry_per_turn(questions):
    """A conversation run turn by turn as the runner does it, recorded in the multi-turn shape."""
    from experiments.hierarchies import load_hierarchy
    from pipespec.api import Pipeline

    sample = load_dataset(spec_bench_cfg(questions))[0]
    template = load_conf("dataset", "spec_bench")["prompt"]
    answers, turns, traced = [], [], []
    with Pipeline(load_hierarchy("tiny_k2"), strategy="pipespec", lookahead=2) as pipe:
        for turn in range(len(sample_turns(sample))):
            ids, _ = turn_prompt_ids(sample, turn, answers, template, pipe.tokenizer, "base",
                                     pipe.context_length, MAX_NEW_TOKENS)  # fmt: skip
            result = pipe.generate(ids, MAX_NEW_TOKENS)
            answers.append(history_answer(result.text))
            turns.append({"output_text": result.text, "new_tokens": len(result.tokens), "time_s": result.time_s})
            traced.append({"stages": [t.to_dict() for t in result.stage_traces]})
    assert answers[0] in turn_prompt_text(sample, 1, answers[:1], template, pipe.tokenizer, "base")
    record = {"sample_id": sample.sample_id, "turns": turns, **record_fields(sample)}
    line = answer_line(record, {"turns": traced}, question_id=81, category="writing", model_id="m", tstamp=0.0,
                       where="test")  # fmt: skip
    choice = line["choices"][0]
    assert choice["turns"] == answers and choice["new_tokens"] == [t["new_tokens"] for t in turns]
    assert choice["wall_time"] == [t["time_s"] for t in turns] and len(choice["decoding_steps"]) == 2
    assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
    assert speed_figures([line])["tokens_per_s"] == pytest.approx(sum(choice["new_tokens"]) / sum(choice["wall_time"]))


# ---- the conversion on its own -------------------------------------------------------------------


def steps(kinds, accepted):
    return {"steps": {"kind": kinds, "accepted": accepted}}


def test_accept_lengths_are_cut_to_the_tokens_kept():
    # a verification that accepted an EOS draft adds a bonus token the output does not keep
    assert target_accept_lengths(steps(["single", "verify", "verify"], [0, 2, 3]), 7, "s") == ([1, 3, 3], 3)
    assert target_accept_lengths(steps(["single", "verify"], [0, 2]), 4, "s") == ([1, 3], 2)
    with pytest.raises(ResultsError, match="s: the target's steps made 4 tokens, fewer than the 5 kept"):
        target_accept_lengths(steps(["single", "verify"], [0, 2]), 5, "s")


def test_speedup_is_a_ratio_of_mean_rates_and_pooled_beside_it():
    def answer(category, tokens, seconds, lengths):
        choice = {"new_tokens": tokens, "wall_time": seconds, "accept_lengths": lengths}
        return {"category": category, "choices": [choice]}

    method = [answer("qa", [10], [1.0], [2, 3, 5]), answer("writing", [30, 10], [1.0, 1.0], [4])]
    baseline = [answer("qa", [10], [2.0], [1]), answer("writing", [40], [4.0], [1])]
    overall = speed_figures(method, baseline)
    assert overall["tokens_per_s"] == (10.0 + 20.0) / 2
    assert overall["baseline_tokens_per_s"] == (5.0 + 10.0) / 2
    assert overall["speedup"] == 15.0 / 7.5
    assert overall["tokens_per_s_pooled"] == 50 / 3.0 and overall["speedup_pooled"] == (50 / 3.0) / (50 / 6.0)
    assert overall["mean_accepted_tokens"] == 14 / 4  # pooled over all accept lengths, as np.mean of the list
    assert [row["task"] for row in speed_report(method, baseline)] == ["mt_bench", "qa", "overall"]
    assert speed_figures(method)["speedup"] is None
