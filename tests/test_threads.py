"""Many callers on one Pipeline, and the errors a caller gets for a bad prompt or an unguarded script."""

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pipespec import ConfigError, Pipeline
from experiments.hierarchies import resolve_stages

ROOT = Path(__file__).resolve().parent.parent
TINY_K3 = resolve_stages([{"model": f"tiny:{name}"} for name in ("draft_noise0.3", "draft_noise0.05", "target")])
STRATEGIES = ("greedy", "sd", "pipespec")
PROMPTS = [[3 + i, 17, 40 + 7 * i, 9, 121 - i] for i in range(8)]
NEW_TOKENS = 10
CALL_TIMEOUT_S = 120  # every call ends well before: a hang fails the test instead of blocking it


@pytest.fixture(scope="module")
def pipe():
    with Pipeline(TINY_K3, strategy="pipespec", lookahead=1, stall_timeout_s=20) as pipe:
        yield pipe


@pytest.fixture(scope="module")
def references(pipe):
    """Each prompt's greedy output, one call at a time."""
    return [pipe.generate(p, NEW_TOKENS, strategy="greedy").tokens for p in PROMPTS]


def test_eight_threads_of_five_mixed_calls_each_equal_greedy(pipe, references):
    results: dict[tuple[int, int], tuple[str, list[int]]] = {}
    errors: list[BaseException] = []

    def caller(thread: int) -> None:
        try:
            for call in range(5):
                strategy = STRATEGIES[(thread + call) % len(STRATEGIES)]
                prompt = PROMPTS[(thread * 5 + call) % len(PROMPTS)]
                result = pipe.generate(prompt, NEW_TOKENS, strategy=strategy, timeout_s=CALL_TIMEOUT_S)
                results[(thread, call)] = (strategy, prompt, result.tokens)
        except BaseException as error:  # reported below, with the thread's results
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(8 * 5 * CALL_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors, errors
    assert len(results) == 40
    assert {strategy for strategy, _, _ in results.values()} == set(STRATEGIES)
    for (thread, call), (strategy, prompt, tokens) in results.items():
        assert tokens == references[PROMPTS.index(prompt)], (thread, call, strategy)


def test_submit_serves_queued_calls_in_order(pipe, references):
    futures = [pipe.submit(p, NEW_TOKENS, strategy=STRATEGIES[i % 3]) for i, p in enumerate(PROMPTS)]
    assert [f.result(timeout=CALL_TIMEOUT_S).tokens for f in futures] == references
    bad = pipe.submit(None, NEW_TOKENS)
    with pytest.raises(ConfigError, match="NoneType"):
        bad.result(timeout=CALL_TIMEOUT_S)


@pytest.mark.parametrize(
    "prompt, named",
    [(None, "NoneType"), (3.5, "float"), ([1, 2.0, 3], "float"), ([[1, 2], [3]], "list"), ([1, True], "bool"),
     (True, "bool"), ({"ids": [1]}, "dict"), (b"bytes", "bytes")],
)  # fmt: skip
def test_a_prompt_that_is_neither_text_nor_ids_gets_a_config_error_naming_its_type(prompt, named):
    pipe = Pipeline(TINY_K3)  # never started: the prompt is refused first
    with pytest.raises(ConfigError, match=f"prompt must be a string or a sequence of token ids.*{named}"):
        pipe.generate(prompt, 4)
    assert not pipe.started


UNGUARDED = """
from pipespec import Pipeline
from experiments.hierarchies import resolve_stages

pipe = Pipeline(resolve_stages([{"model": "tiny:draft_noise0.05"}, {"model": "tiny:target"}]), strategy="sd")
print(pipe.generate([5, 6, 7], 4).tokens)
pipe.close()
"""


@pytest.mark.slow
def test_a_script_without_the_main_guard_is_told_the_fix(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(UNGUARDED))
    result = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-5:]
    assert any("ConfigError" in line and "__main__" in line for line in last), result.stderr[-3000:]
    assert 'if __name__ == "__main__":' in result.stderr and "    main()" in result.stderr
    assert "bootstrapping phase" not in result.stderr  # multiprocessing's own long error never comes
