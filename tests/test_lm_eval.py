"""lm-eval's `pipespec` model (the `lmeval` extra): local tasks on the tiny k = 2 hierarchy score exactly as
lm-eval's own `hf` model on the same target; sampling, bad input and the extra missing."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_lm_eval")
SLOW_FIXTURES = ('hf_results', 'pipespec_results')  # lm-eval evaluations: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent
HIERARCHY = "tiny_k2"
TASKS = ("tiny_generate", "tiny_choice", "tiny_rolling")
STOP = "t40"  # an explicit stop sequence (lm-eval adds the target's EOS text, "t1", to every request)
PROMPTS = ["t63 t250 t252 t71 t215", "t75 t80 t40 t59 t200", "t2 t249 t250 t96 t229", "t35 t253 t77 t20 t30"]
CHOICES = [
    {"question": "t63 t250 t252", "choices": ["t71 t215", "t5 t6", "t200"], "label": 0},
    {"question": "t75 t80", "choices": ["t9", "t40 t59", "t3 t3 t3"], "label": 1},
    {"question": "t2 t249", "choices": ["t250 t96", "t229"], "label": 0},
]
TEXTS = ["t5 t9 t22 t40 t100 t3 t77 t8", "t63 t250 t252 t71"]
MAX_GEN_TOKS = 16

needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None, reason="the lmeval extra is not installed (pip install -e '.[lmeval]')"
)

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
{body}metric_list:
{metrics}"""


def metric(name: str, aggregation: str, higher: bool) -> str:
    return f"  - metric: {name}\n    aggregation: {aggregation}\n    higher_is_better: {str(higher).lower()}\n"


def write_task(directory: Path, name: str, rows: list[dict], output_type: str, body: str, metrics: str) -> None:
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    yaml = TASK_YAML.format(name=name, data=data, output_type=output_type, body=body, metrics=metrics)
    (directory / f"{name}.yaml").write_text(yaml)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A generate_until, a multiple-choice (loglikelihood) and a loglikelihood_rolling task over local jsonl."""
    directory = tmp_path_factory.mktemp("lm_eval_tasks")
    generate = (f'doc_to_text: "{{{{prompt}}}}"\ndoc_to_target: "{{{{answer}}}}"\ngeneration_kwargs:\n'
                f'  until: ["{STOP}"]\n  max_gen_toks: {MAX_GEN_TOKS}\n  do_sample: false\n')  # fmt: skip
    write_task(directory, "tiny_generate", [{"prompt": p, "answer": "t2 t82"} for p in PROMPTS], "generate_until",
               generate, metric("exact_match", "mean", True))  # fmt: skip
    choice = 'doc_to_text: "{{question}}"\ndoc_to_choice: choices\ndoc_to_target: label\n'
    write_task(directory, "tiny_choice", CHOICES, "multiple_choice", choice,
               metric("acc", "mean", True) + metric("acc_norm", "mean", True))  # fmt: skip
    rolling = 'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
    write_task(directory, "tiny_rolling", [{"text": t} for t in TEXTS], "loglikelihood_rolling", rolling,
               metric("word_perplexity", "weighted_perplexity", False) + metric("bits_per_byte", "bits_per_byte", False))
    return directory


@pytest.fixture(scope="module")
def task_manager(task_dir):
    """lm-eval's task index with the local tasks (built once: it reads every task lm-eval ships)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(task_dir))


def evaluate(model: str, model_args: str, task_manager) -> dict:
    import lm_eval

    import experiments.lm_eval_model  # noqa: F401  (registers --model pipespec)

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=list(TASKS), batch_size=1,
                                   task_manager=task_manager, log_samples=True)  # fmt: skip


@pytest.fixture(scope="module")
def target_dir():
    from experiments.hierarchies import read_hierarchy, resolve_stages

    return resolve_stages(read_hierarchy(HIERARCHY)["stages"])[-1].model


@pytest.fixture(scope="module")
def hf_results(task_manager, target_dir):
    return evaluate("hf", f"pretrained={target_dir},device=cpu", task_manager)


@pytest.fixture(scope="module")
def pipespec_results(task_manager):
    return evaluate("pipespec", f"hierarchy={HIERARCHY},strategy=pipespec,lookahead=2", task_manager)


def responses(results: dict, task: str) -> list:
    return [sample["filtered_resps"] for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def greedy_continuations(target_dir: str) -> tuple[list[str], str]:
    """The target's own greedy continuations of PROMPTS (transformers' generate), decoded as lm-eval decodes
    them, and the text of its end-of-sequence token (a stop sequence of every request)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(target_dir), AutoModelForCausalLM.from_pretrained(target_dir)
    texts = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_GEN_TOKS, do_sample=False)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts, tokenizer.eos_token


# ---- scores equal to hf's -----------------------------------------------------------------------


@needs_lm_eval
@pytest.mark.parametrize("task", TASKS)
def test_pipespec_scores_equal_the_hf_models_on_the_same_target(task, hf_results, pipespec_results):
    assert pipespec_results["results"][task] == hf_results["results"][task]
    assert responses(pipespec_results, task) == responses(hf_results, task)
    assert len(responses(pipespec_results, task)) == {"tiny_generate": 4, "tiny_choice": 3, "tiny_rolling": 2}[task]


@needs_lm_eval
def test_generations_are_the_targets_greedy_text_cut_at_the_first_stop(pipespec_results, target_dir):
    got = [r[0] for r in responses(pipespec_results, "tiny_generate")]
    texts, eos = greedy_continuations(target_dir)
    assert got == [text.split(STOP)[0].split(eos)[0] for text in texts]
    assert any(got), "every continuation empty: the test would compare nothing"
    assert any(STOP in text.split(eos)[0] for text in texts), "the explicit stop never cut a continuation"
    info = pipespec_results["config"]
    assert info["pipespec_hierarchy"] == HIERARCHY and info["pipespec_strategy"] == "pipespec"


# ---- sampling --------------------------------------------------------------------------------------


@needs_lm_eval
def test_sampled_requests_follow_the_request_and_replay_with_the_seed(pipespec_results):
    from lm_eval.api.instance import Instance

    from experiments.lm_eval_model import PipespecLM

    lm = PipespecLM(hierarchy=HIERARCHY, strategy="sd", lookahead=3, seed=7)
    sampled = {"until": [STOP], "max_gen_toks": MAX_GEN_TOKS, "do_sample": True, "temperature": 5.0}
    assert lm.generation_call(PROMPTS[0], sampled).sampling == {"temperature": 5.0, "top_k": 0, "top_p": 1.0}
    assert lm.generation_call(PROMPTS[0], {**sampled, "top_k": 4, "top_p": 0.5}).sampling["top_k"] == 4
    assert lm.generation_call(PROMPTS[0], {**sampled, "do_sample": False}).sampling == {"temperature": 0.0}
    requests = [Instance("generate_until", {}, (p, dict(sampled)), i) for i, p in enumerate(PROMPTS)]
    first, again = lm.generate_until(requests), lm.generate_until(requests)  # a fresh pipeline each call
    assert first == again, "sd with a fixed seed draws the same tokens every time"
    assert first != [r[0] for r in responses(pipespec_results, "tiny_generate")], "temperature 5 gave the greedy text"


# ---- bad input ---------------------------------------------------------------------------------------


@needs_lm_eval
@pytest.mark.parametrize(
    "model_args, message",
    [
        ({"hierarchy": HIERARCHY, "lookahed": 2}, "unknown --model_args ['lookahed']"),
        ({"strategy": "sd"}, "needs --model_args hierarchy=NAME"),
        ({"hierarchy": "no_such_hierarchy"}, "unknown model hierarchy 'no_such_hierarchy'"),
        ({"hierarchy": HIERARCHY, "strategy": "sd9"}, "unknown strategy 'sd9'"),
        ({"hierarchy": HIERARCHY, "strategy": "sd", "lookahead": -1}, "lookahead"),
    ],
)
def test_bad_model_args_are_one_config_error_before_anything_loads(model_args, message):
    from experiments.lm_eval_model import PipespecLM
    from pipespec.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PipespecLM(**model_args)


@needs_lm_eval
def test_a_generation_option_the_pipeline_cannot_honour_is_refused():
    from experiments.lm_eval_model import PipespecLM
    from pipespec.errors import ConfigError

    lm = PipespecLM(hierarchy=HIERARCHY, strategy="greedy")
    with pytest.raises(ConfigError, match=r"cannot apply the generation option\(s\) \['num_beams'\]"):
        lm.generation_call(PROMPTS[0], {"until": [STOP], "num_beams": 2})


@needs_lm_eval
@pytest.mark.slow
def test_the_command_line_finds_the_model_and_prints_one_error_line(task_dir):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.lm_eval", "--model", "pipespec", "--model_args",
         f"hierarchy={HIERARCHY},lookahed=2", "--tasks", "tiny_choice", "--include_path", str(task_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "unknown --model_args ['lookahed']" in errors[0], result.stderr[-3000:]


def site_without_lm_eval(directory: Path) -> Path:
    """A site directory holding everything installed here except lm-eval."""
    import sysconfig

    directory.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("lm_eval", "lm-eval")):
            (directory / entry.name).symlink_to(entry)
    return directory


def test_the_lmeval_extra_missing_is_one_error_line_naming_it(tmp_path):
    site = site_without_lm_eval(tmp_path / "site")
    program = (f"import runpy, site, sys; site.addsitedir({str(site)!r}); sys.argv[0] = 'experiments.lm_eval'; "
               "runpy.run_module('experiments.lm_eval', run_name='__main__', alter_sys=True)")  # fmt: skip
    result = subprocess.run([sys.executable, "-S", "-c", program, "--model", "pipespec", "--tasks", "x"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip() == "error: lm-eval is not installed: pip install 'pipespec[lmeval]'"
