"""HF `generate` vs pipespec on the same models, prompts and machine, in one invocation.

    python -m experiments.bench                           # conf/bench.yaml: HumanEval, then news_lee
    python -m experiments.bench dataset=humaneval         # one dataset (any dataset override means one)
    python -m experiments.bench samples=2 max_new_tokens=32 repetitions=1
    python -m experiments.bench models@k2=tiny_k2 models@k3=tiny_k3 random_prompt_length=12

The config composes the runner's groups: `models@k2` and `models@k3` (the hierarchies),
`strategy@pipespec` and `strategy@sd` (their settings) and `dataset`. The systems
(`experiments.benchlib.systems`) run in the order of `systems`, alternating per prompt
within every repetition (A B C A B C ...; `benchlib.timer`). `sd` runs at the
(window, draft_confidence) that was fastest in a pre-pass over `sd_windows` x
`sd_draft_confidences` on the first `prepass_prompts` prompts; HF assisted generation
gets the same pre-pass over the `hf.assisted` settings. Both choices are recorded.

Outputs in the Hydra run directory: `bench.json` (the schema is in
`benchlib.report.write_outputs`), `bench.md` (the tables, also printed) and `runs.json`
(every run, with the stage traces of our systems, for re-analysis).

Where the time goes (per stage, per generated token, pooled over a system's runs with
`pipespec.stats.StageStats`; `benchlib.report`):
- compute: the stage's time inside steps (its forward passes);
- idle: trace wall time minus compute: waiting (for drafts, or for a commit after running
  `max_lead` ahead) and control-message handling, which the traces cannot separate;
  `control_est` = gaps between steps x the 10th percentile of those gaps;
- rollback waste (drafters): its tokens later rolled back x its compute per produced token;
- rejected drafts (verifiers): drafts fed but rejected x the marginal cost b of a fed token;
- driver overhead: `generate`'s wall time minus the target's trace wall time.

The ideal-pipeline bound of a run of one of our systems: no stage ever idles, and the
target verifies at every step as many drafts as the measured acceptance allows. With the
target's step cost t(n) = a + b n fitted by `analysis.fit.fit_step_cost` over its
non-prefill steps (n = tokens fed), m = mean drafts accepted and f = mean tokens fed per
non-prefill verification (m = 0 and f = the mean fed when there are none), a run of T
output tokens whose prefill step took t_0 and produced p tokens needs at least

    time_target = t_0 + (T - p) * t(f) / (m + 1)

of target compute, and each other stage i its measured compute busy_i. So

    bound = sum_runs T / sum_runs max(time_target, max_i busy_i)

and `binding_stage` names the stage whose total is largest. For `greedy` the bound is the
target's pure compute rate; for `sd` it is the pipeline its acceptance would allow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

from experiments.hub import default_offline  # noqa: E402

default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the bench names a hub id (experiments.hub)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from experiments.compose import CONFIG_PATH, load  # noqa: E402

from experiments.benchlib.config import check_config, check_datasets, check_group_overrides, load_prompts  # noqa: E402
from experiments.benchlib.report import format_markdown, prompt_source, summarize, write_outputs  # noqa: E402
from experiments.benchlib.systems import Systems, resolve_setup  # noqa: E402
from experiments.benchlib.timer import PeakRSS, alternate  # noqa: E402
from experiments.data import DataError  # noqa: E402
from experiments.profiler import SHORT_PROMPTS  # noqa: E402
from pipespec.errors import ConfigError, StageError  # noqa: E402
from pipespec.models import context_length, load_tokenizer  # noqa: E402

# torch is imported where the bench runs (`run_bench`): `--help` and a bad option import none of it.


def run_bench(cfg: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Run the whole benchmark; write bench.json, bench.md and runs.json into out_dir; return the report."""
    import torch

    cfg = check_config(cfg)
    setup = resolve_setup(cfg)
    tokenizer = load_tokenizer(setup.target.model)
    family = cfg.get("prompt_family") or setup.k2.family or "chat"
    prompts = load_prompts(cfg, tokenizer, context_length(setup.target.model), family)
    max_new = cfg["max_new_tokens"]
    torch.set_num_threads(cfg["hf"]["threads"][0])

    rss = PeakRSS().start()
    started = None
    try:
        started = Systems(cfg, setup, auto_profile_prompts(cfg, tokenizer, context_length(setup.target.model), family))
        systems = started.compile_hf(started.build(), prompts[0], max_new)  # before anything is timed
        if cfg["warmup_tokens"] > 0:  # one short untimed generation per system (first-call allocations)
            for system in systems:
                system.run(prompts[0], cfg["warmup_tokens"])
        prepass = started.choose_settings(systems, prompts[: cfg["prepass_prompts"]], max_new)
        alternate(systems, prompts, cfg["repetitions"], max_new, rss, cfg.get("progress", True))
        processes = started.processes()
        report = summarize(cfg, systems, prompts, rss, prepass, setup.k2, setup.k3, family, setup.more)
        report["processes"] = processes
        report["skipped"] = dict(started.skipped)
        report["notes"] += [f"{name} not run: {why}" for name, why in started.skipped.items()]
        graphs = started.recompiles()
        if graphs is not None:
            report["hf_compiled_graphs"] = graphs
            report["notes"].append(f"hf_compiled: {graphs['graphs_before_timing']} graph(s) compiled before "
                                   f"timing, {graphs['graphs_compiled_while_timed']} while timed (recompiles)")
    finally:
        rss.stop()
        if started is not None:
            started.close()
    write_outputs(report, systems, out_dir)
    return report


def auto_profile_prompts(cfg: Mapping[str, Any], tokenizer, context: int | None, family: str) -> list | None:
    """The prompts `auto` measures its short profile on when it has no profile: the dataset's first ones
    (before `prompt_offset`'s timed prompts when the offset leaves room), so a news bench profiles news."""
    if "auto" not in cfg["systems"] or cfg["auto"].get("profile") is not None:
        return None
    return load_prompts({**cfg, "samples": SHORT_PROMPTS, "prompt_offset": 0}, tokenizer, context, family)


def check_run_dir(cfg: Mapping[str, Any], out_dir: str | Path) -> None:
    """A bench runs into a directory that holds no bench: its results there would be overwritten (checked before
    anything runs, and by `experiments.callbacks.CheckRunDirectory` before Hydra writes)."""
    out_dir = Path(out_dir)
    found = [p for p in (out_dir / "bench.md", out_dir / "bench.json", *out_dir.glob("*/bench.json")) if p.exists()]
    if found:
        raise ConfigError(f"{out_dir} already holds a bench ({found[0].relative_to(out_dir)}): choose another "
                          "hydra.run.dir, or move it away to run it again")  # fmt: skip


def run_datasets(cfg: Mapping[str, Any], out_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The whole benchmark once per dataset of `datasets` (each into out_dir/NAME, with its own
    `targets_by_dataset` on top of `targets`), or once on the composed `dataset` when it is null."""
    check_run_dir(cfg, out_dir)
    names = check_datasets(cfg)
    if not names:
        return [(prompt_source(cfg), run_bench(cfg, out_dir))]
    reports = []
    for name in names:
        targets = {**(cfg.get("targets") or {}), **((cfg.get("targets_by_dataset") or {}).get(name) or {})}
        one = {**cfg, "dataset": load("dataset", name), "datasets": None, "targets": targets}
        print(f"[bench] dataset {name} -> {out_dir / name}", file=sys.stderr)
        reports.append((name, run_bench(one, out_dir / name)))
    summary = "\n\n".join(f"<!-- {name}: {out_dir / name / 'bench.md'} -->\n" + format_markdown(r) for name, r in reports)
    (out_dir / "bench.md").write_text(summary + "\n")
    return reports


def _fail(error: BaseException) -> None:
    print(f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="bench")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        reports = run_datasets(plain, out_dir)
    except (ConfigError, StageError, DataError) as error:
        _fail(error)
    for name, report in reports:
        print(format_markdown(report))
        where = out_dir / name if len(reports) > 1 else out_dir
        print(f"[bench] wrote {where / 'bench.json'}, {where / 'bench.md'}", file=sys.stderr)


def single_dataset_argv(argv: list[str]) -> list[str]:
    """`dataset=NAME` or `dataset.KEY=...` on the command line (and no `datasets=`) means that one dataset."""
    keys = [a.lstrip("+~").partition("=")[0] for a in argv]
    if any(k == "dataset" or k.startswith("dataset.") for k in keys) and "datasets" not in keys:
        return argv + ["datasets=null"]
    return argv


def entry() -> None:
    try:
        check_group_overrides(sys.argv[1:])
    except ConfigError as error:
        _fail(error)
    sys.argv[1:] = single_dataset_argv(sys.argv[1:])
    main()


if __name__ == "__main__":
    entry()
