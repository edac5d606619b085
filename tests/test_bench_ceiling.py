"""The ceiling reader: what stops a bench system short of a speedup target (experiments.benchlib.ceiling)."""

import json

import pytest

from experiments.benchlib.ceiling import main, system_rows, target_weight_bytes


def _report():
    return {
        "hf_greedy_reference": "hf_greedy",
        "systems": [
            {"name": "hf_greedy", "kind": "hf", "tokens_per_s_median": 10.0, "tokens_per_target_step": 1.0,
             "ideal_bound_tokens_per_s": None,
             "breakdown": {"stages": [{"stage": "driver: HF target forwards", "compute_ms_per_token": 95.0}]}},
            {"name": "sd@smollm2_suffix_flat_fp32_t2_compiled", "kind": "pipespec", "tokens_per_s_median": 18.0,
             "tokens_per_target_step": 1.5, "ideal_bound_tokens_per_s": 22.0,
             "breakdown": {"stages": [{"stage": "0:suffix-flat"},
                                      {"stage": "1:fp32", "compute_ms_per_token": 40.0}]}},
        ],
    }


def test_the_tokens_per_step_needed_and_the_ratio_at_the_floor_follow_from_the_step():
    rows = {r["system"]: r for r in system_rows(_report(), target=2.0, floor_ms=25.0)}
    sd = rows["sd@smollm2_suffix_flat_fp32_t2_compiled"]
    assert sd["ratio"] == pytest.approx(1.8) and sd["bound_ratio"] == pytest.approx(2.2)
    assert sd["target_step_ms"] == pytest.approx(60.0)            # 40 ms per token x 1.5 tokens per step
    assert sd["tokens_per_step_needed"] == pytest.approx(1.2)     # 2.0 x 60 ms / HF greedy's 100 ms per token
    assert sd["ratio_at_floor"] == pytest.approx(6.0)             # 1.5 tokens x 100 ms / 25 ms
    assert rows["hf_greedy"]["ratio"] == pytest.approx(1.0)


def test_the_cli_prints_each_datasets_table_and_refuses_a_folder_without_a_bench(tmp_path, capsys):
    (tmp_path / "news_lee_cnndm").mkdir()
    (tmp_path / "news_lee_cnndm" / "bench.json").write_text(json.dumps(_report()))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "news_lee_cnndm: target 1.75x" in out and "SD k=2" in out
    assert main([str(tmp_path / "news_lee_cnndm" / "nothing")]) == 2
    assert "no bench.json" in capsys.readouterr().err


def test_the_weights_a_step_reads_are_the_safetensors_bytes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    assert target_weight_bytes(tmp_path) == 1000
    with pytest.raises(SystemExit, match="no \\*.safetensors"):
        target_weight_bytes(tmp_path / "missing")
