"""Paired, interleaved sweep: greedy and any list of configurations of one hierarchy, on one set of stage
processes, each prompt slot running every configuration in turn (`analysis.paired.rotation`).

    python -m experiments.sweep                                   # conf/sweep.yaml: suffix -> fp32, HumanEval
    python -m experiments.sweep models=smollm2_int8_fp32 dataset=news_lee_cnndm samples=8 repetitions=3
    python -m experiments.sweep 'configurations=[{strategy: sd, lookahead: 4}]' profile=PROFILE.json

The strategy and its options change per call on the same pipeline, so every configuration of a prompt slot
runs within seconds of greedy's run of the same prompt: its speedup against greedy is a paired ratio that the
machine's drift over minutes cannot bend (`analysis.paired`: geometric mean, and 95% intervals over
repetitions and over prompts). Every call of a hierarchy with a suffix stage starts with its earlier outputs
forgotten (`forget_outputs`), so no configuration is drafted from another's identical output of the prompt.

The sweep directory holds one run directory per configuration (`analysis.rundir`: config.yaml, env.json,
samples.jsonl with each record's `slot` {prompt, repetition} and sample id `ID@rN`, traces/, summary.json
with identity and speedup against the greedy run beside it), and `paired.json` / `paired.md`. With `profile=`
every record also carries its speed factor (the target's measured step seconds over the profile's t(n) for
the same steps). Interrupted, `resume=true` in the same `hydra.run.dir` continues: finished samples are kept,
nothing is measured twice.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from experiments.hub import default_offline  # noqa: E402
default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from experiments.compose import CONFIG_PATH  # noqa: E402
from analysis.paired import (REFERENCE, configuration_name, format_table, paired_speedups, partial_stages,
                             rotation, speed_factor, sweep_samples)  # noqa: E402
from pipespec.errors import ConfigError, StageError  # noqa: E402
from analysis.predict import sample_cost  # noqa: E402
from analysis.profile import ProfileError, load_profile  # noqa: E402
from analysis.rundir import (ARCHIVE, CONFIG, ResultsError, SAMPLES, SUMMARY, atomic_write_json, atomic_write_text,
                             read_config, refresh_reference, summarize_run)  # noqa: E402
from experiments.data import DataError, build_prompt_ids, load_dataset, render_prompt_text  # noqa: E402
from experiments.hierarchies import resolve_stages  # noqa: E402
from experiments.machine import environment  # noqa: E402

# torch, tqdm and the modules that import torch (experiments.runner, pipespec.api, pipespec.options) are
# imported where used: importing this module stays cheap for the tests and `experiments.bench`.

CONFIGURATION_KEYS = ("strategy", "lookahead", "max_lead", "draft_confidence", "size_verification", "cascade",
                      "value_stop", "stages")  # fmt: skip


@dataclass(frozen=True)
class Configuration:
    """One setting of the hierarchy: its folder name and the `generate` options it runs with."""

    name: str
    options: dict[str, Any]


def check_configurations(raw: Any, stage_kinds: Sequence[str], stage_labels: Sequence[str],
                         tree_nodes: int = 0) -> list[Configuration]:  # fmt: skip
    """The sweep's configurations, greedy first: each a mapping of `CONFIGURATION_KEYS` (and `name`) that can
    run on these stages; a `ConfigError` naming the bad one before anything starts. `stages` runs a
    configuration on some of the started stages (positions ending with the target, as `generate(stages=)`;
    its name says so, e.g. pipespec_L0_M8_S0-2). `tree_nodes`: the first stage's token trees (> 0: every
    configuration runs them, and its default name says so)."""
    from pipespec.options import CallOptions

    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError("configurations must be a non-empty list of mappings, e.g. [{strategy: sd, lookahead: 4}]")
    found = [Configuration(REFERENCE, {"strategy": "greedy"})]
    for position, entry in enumerate(raw):
        where = f"configurations[{position}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping of {list(CONFIGURATION_KEYS)}, got {entry!r}")
        unknown = sorted(set(entry) - set(CONFIGURATION_KEYS) - {"name"})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; expected some of {list(CONFIGURATION_KEYS)} and name")
        options = {key: entry[key] for key in CONFIGURATION_KEYS if key in entry}
        try:
            call = CallOptions(**options)
            call.plan(stage_kinds, stage_labels)
        except ConfigError as error:
            raise ConfigError(f"{where} cannot run on {' > '.join(stage_labels)}: {error}") from None
        if "stages" in options:  # the positions checked; every stage is the configuration without the key
            stages = partial_stages(call.strategy, call.chosen_stages(stage_kinds, stage_labels), len(stage_kinds))
            options = {k: v for k, v in options.items() if k != "stages"} | ({} if stages is None else {"stages": stages})
        name = str(entry.get("name") or configuration_name({**options, "tree_nodes": tree_nodes}))
        if any(name == c.name for c in found):
            if name == REFERENCE:
                continue  # greedy listed again: it runs once, as the reference
            raise ConfigError(f"{where}: the name {name!r} is taken by another configuration (give it a name)")
        found.append(Configuration(name, options))
    return found


def check_counts(cfg: Mapping[str, Any]) -> None:
    for key, minimum in (("samples", 1), ("repetitions", 1), ("max_new_tokens", 1), ("prompt_offset", 0),
                         ("warmup_tokens", 0)):  # fmt: skip
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")


def run_config(cfg: Mapping[str, Any], configuration: Configuration) -> dict[str, Any]:
    """What the configuration's run directory records as its config.yaml (the runner's shape)."""
    strategy = {"name": configuration.options.get("strategy", "pipespec"),
                **{k: v for k, v in configuration.options.items() if k != "strategy"}}  # fmt: skip
    return {"models": cfg["models"], "strategy": strategy, "dataset": cfg["dataset"],
            "max_new_tokens": cfg["max_new_tokens"], "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0},
            "acceptance": {"mode": "exact", "rate": None},
            "sweep": {"name": configuration.name, "repetitions": cfg["repetitions"], "samples": cfg["samples"],
                      "prompt_offset": cfg["prompt_offset"], "forget_outputs": cfg["forget_outputs"]}}  # fmt: skip


def sweep_prompts(cfg: Mapping[str, Any], tokenizer, context_length: int | None) -> list[tuple[Any, list[int], bool]]:
    """(sample, prompt ids, truncated) of the `samples` prompts after the first `prompt_offset`."""
    offset, count = cfg["prompt_offset"], cfg["samples"]
    dataset = load_dataset({**cfg["dataset"], "n_samples": offset + count})
    chosen = dataset.samples[offset : offset + count]
    if len(chosen) < count:
        raise ConfigError(f"dataset {dataset.name} has {len(dataset.samples)} samples: not {count} after the first "
                          f"{offset} (prompt_offset)")  # fmt: skip
    family = cfg["models"].get("family", "base")
    return [(s, *build_prompt_ids(s, cfg["dataset"]["prompt"], tokenizer, family, context_length,
                                  cfg["max_new_tokens"])) for s in chosen]  # fmt: skip


class Sweep:
    """The run directories of one sweep and the loop that fills them."""

    def __init__(self, cfg: Mapping[str, Any], out_dir: Path, configurations: list[Configuration], pipe,
                 prompts: list, profile_target=None):  # fmt: skip
        from experiments.runner import open_store

        self.cfg, self.out_dir, self.configurations, self.pipe, self.prompts = cfg, out_dir, configurations, pipe, prompts
        self.profile_target = profile_target  # the profile's target stage (`analysis.profile.StageProfile`), or None
        self.forget = bool(cfg["forget_outputs"]) and any(s.kind == "suffix" for s in pipe.specs)
        check_run_dir(cfg, out_dir, [c.name for c in configurations])
        self.configs = {c.name: run_config(cfg, c) for c in configurations}  # each run's config.yaml
        self.stores = {name: open_store(out_dir / name, config, bool(cfg["resume"]))
                       for name, config in self.configs.items()}  # fmt: skip
        self.todo = self.slots()  # empty: a finished sweep resumed, which measures nothing and rewrites none of its runs
        if self.todo:
            env = environment(pipe.specs)
            for name, store in self.stores.items():
                store.write_config(self.configs[name])
                store.write_env(env)

    def slots(self) -> list[tuple[int, int, Configuration]]:
        """(repetition, prompt index, configuration) in run order, without the finished ones."""
        done = {name: store.finished_ids for name, store in self.stores.items()}
        order = []
        for repetition in range(self.cfg["repetitions"]):
            for index, (sample, _, _) in enumerate(self.prompts):
                for configuration in _rotation(self.configurations, index, repetition):
                    if f"{sample.sample_id}@r{repetition}" not in done[configuration.name]:
                        order.append((repetition, index, configuration))
        return order

    def warm_up(self) -> None:
        tokens = self.cfg["warmup_tokens"]
        if tokens:
            for configuration in self.configurations:
                self.pipe.generate(self.prompts[0][1], tokens, **configuration.options, forget_outputs=self.forget)

    def run_one(self, repetition: int, index: int, configuration: Configuration) -> None:
        from experiments.runner import sample_record

        sample, ids, truncated = self.prompts[index]
        result = self.pipe.generate(ids, self.cfg["max_new_tokens"], **configuration.options, forget_outputs=self.forget)
        text = render_prompt_text(sample.source, self.cfg["dataset"]["prompt"], self.pipe.tokenizer,
                                  self.cfg["models"].get("family", "base"))  # fmt: skip
        record = sample_record(index, sample, text, ids, truncated, result, None)
        record["sample_id"] = f"{sample.sample_id}@r{repetition}"
        record["index"] = repetition * len(self.prompts) + index
        record["slot"] = {"prompt": str(sample.sample_id), "repetition": repetition}
        if self.profile_target is not None:
            cost = sample_cost(self.profile_target, len(ids))
            record["speed_factor"] = speed_factor(result.stage_traces[-1].steps, cost)
        trace = {"sample_id": record["sample_id"], "index": record["index"],
                 "stages": [t.to_dict() for t in result.stage_traces]}  # fmt: skip
        self.stores[configuration.name].append(record, trace)

    def finish(self) -> list:
        """Each run's summary (greedy's first: the others find it as their reference), then the paired table;
        a finished sweep resumed (nothing to do) leaves the summaries its runs have as they are."""
        for configuration in self.configurations:
            store = self.stores[configuration.name]
            if not self.todo and (store.run_dir / SUMMARY).exists():
                continue
            expected = self.cfg["repetitions"] * len(self.prompts)
            store.write_summary(summarize_run(self.configs[configuration.name], store.records,
                                              complete=len(store.records) == expected))  # fmt: skip
            refresh_reference(store.run_dir)
        speedups = paired_speedups(sweep_samples(self.out_dir), REFERENCE)
        atomic_write_json(self.out_dir / "paired.json", [_as_dict(s) for s in speedups])
        atomic_write_text(self.out_dir / "paired.md", format_table(speedups, REFERENCE) + "\n")
        return speedups


SETTINGS = ("samples", "prompt_offset", "repetitions", "forget_outputs")  # run_config's `sweep`: what was measured


def check_run_dir(cfg: Mapping[str, Any], out_dir: str | Path, names: Sequence[str] | None = None) -> None:
    """Whether `out_dir` may take this sweep, checked before anything is written there (Hydra's `.hydra/` files
    too: `experiments.callbacks.CheckRunDirectory` calls it first): a sweep that holds results only with
    resume=true, and resumed only as it started: its configurations (`names`; None: those of `cfg`) and its
    settings (`check_same_settings`), and with its traces loose (`check_unpacked`). A `ConfigError` naming what
    differs."""
    out_dir = Path(out_dir)
    if not cfg["resume"]:
        if any(p.stat().st_size for p in out_dir.glob(f"*/{SAMPLES}")):
            raise ConfigError(f"{out_dir} already holds a sweep's results: resume=true continues it, or choose "
                              "another hydra.run.dir")  # fmt: skip
        return
    check_unpacked(out_dir)
    if names is None:
        names = [c.name for c in sweep_configurations(cfg)[1]]
    check_same_configurations(out_dir, names)
    check_same_settings(out_dir, cfg)


def check_unpacked(out_dir: Path) -> None:
    """A sweep whose traces were packed into one archive (`python -m analysis.rundir.archive pack`) resumes only
    with them unpacked: a `ConfigError` naming the command that unpacks them."""
    packed = [p for p in (out_dir / ARCHIVE, *sorted(out_dir.glob(f"*/{ARCHIVE}"))) if p.is_file()]
    if packed:
        raise ConfigError(f"{packed[0]} holds the sweep's traces packed: python -m analysis.rundir.archive unpack "
                          f"{packed[0].parent} restores them, then resume=true continues the sweep")  # fmt: skip


def measured_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a configuration's run config (`run_config`) says its sweep measures: the hierarchy, the dataset,
    the tokens and `SETTINGS`."""
    sweep = config.get("sweep", {})
    return {"models": config.get("models"), "dataset": config.get("dataset"),
            "max_new_tokens": config.get("max_new_tokens"), **{k: sweep.get(k) for k in SETTINGS}}


def check_same_settings(out_dir: Path, cfg: Mapping[str, Any]) -> None:
    """A resumed sweep measures what it started measuring: the same hierarchy, dataset, tokens and `SETTINGS`
    as its greedy run's config.yaml records (another prompt_offset would add other prompts to it, another
    forget_outputs another drafter); nothing to compare before its first start wrote that file."""
    if not (out_dir / REFERENCE / CONFIG).exists():
        return
    before = measured_settings(read_config(out_dir / REFERENCE))
    after = measured_settings(run_config(cfg, Configuration(REFERENCE, {"strategy": "greedy"})))
    differing = [k if k in ("models", "dataset") else f"{k} {before[k]!r} -> {after[k]!r}"
                 for k in before if before[k] != after[k]]  # fmt: skip
    if differing:
        raise ConfigError(f"cannot resume the sweep in {out_dir} with other settings ({'; '.join(differing)}): a "
                          "resumed sweep continues what it started measuring; start a new sweep (another "
                          "hydra.run.dir) for other settings")  # fmt: skip


def check_same_configurations(out_dir: Path, names: Sequence[str]) -> None:
    """A resumed sweep times the configurations it started with (each one's folder and config written at the
    start): one added on resuming would be timed minutes after the others, not interleaved with them, and
    one left out would stay half-measured. A `ConfigError` naming the difference."""
    started = sorted(p.parent.name for p in Path(out_dir).glob(f"*/{CONFIG}") if not p.parent.name.startswith("."))
    added, dropped = sorted(set(names) - set(started)), sorted(set(started) - set(names))
    if started and (added or dropped):
        change = "; ".join(([f"added {added}"] if added else []) + ([f"left out {dropped}"] if dropped else []))
        raise ConfigError(f"cannot resume the sweep in {out_dir} with other configurations ({change}): a configuration "
                          "added to a started sweep would not be interleaved with the others; start a new sweep "
                          "(another hydra.run.dir) with the whole list")  # fmt: skip


def _rotation(configurations: list[Configuration], index: int, repetition: int) -> list[Configuration]:
    return rotation(configurations, index, repetition)


def _as_dict(speedup) -> dict:
    return asdict(speedup)


def profile_target(path: str | None, specs):
    """The target stage of a profile of this hierarchy (`analysis.profile.StageProfile`; None without a profile)."""
    if path is None:
        return None
    try:
        profile = load_profile(path)
    except ProfileError as error:
        raise ConfigError(f"profile: {error}") from None
    if len(profile.stages) != len(specs):
        raise ConfigError(f"profile {path} has {len(profile.stages)} stages, this hierarchy {len(specs)}")
    return profile.stages[-1]


def sweep_configurations(cfg: Mapping[str, Any]) -> tuple[list, list[Configuration]]:
    """The sweep's stages (`StageSpec`s) and configurations, greedy first, checked (`check_counts`,
    `check_configurations`)."""
    check_counts(cfg)
    specs = resolve_stages(cfg["models"]["stages"])
    configurations = check_configurations(cfg["configurations"], [s.kind for s in specs], [s.label for s in specs],
                                          specs[0].tree_nodes)  # fmt: skip
    return specs, configurations


def run_sweep(cfg: Mapping[str, Any], out_dir: str | Path) -> list:
    """The whole sweep into `out_dir`; the paired speedups, fastest first."""
    from tqdm import tqdm

    from pipespec.api import Pipeline

    specs, configurations = sweep_configurations(cfg)
    target = profile_target(cfg.get("profile"), specs)
    pipe = Pipeline(specs, stall_timeout_s=cfg["stall_timeout_s"], start_timeout_s=cfg["start_timeout_s"])
    prompts = sweep_prompts(cfg, pipe.tokenizer, pipe.context_length)
    sweep = Sweep(cfg, Path(out_dir), configurations, pipe, prompts, target)
    slots = sweep.todo
    with pipe:
        if slots:
            sweep.warm_up()
        bar = tqdm(slots, desc=f"sweep {cfg['models']['name']} {cfg['dataset']['name']}", unit="run", file=sys.stderr,
                   disable=not cfg["progress"])  # fmt: skip
        for repetition, index, configuration in bar:
            bar.set_postfix_str(f"rep {repetition + 1} {configuration.name}", refresh=False)
            sweep.run_one(repetition, index, configuration)
    return sweep.finish()


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="sweep")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from experiments.runner import RunError

    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        speedups = run_sweep(config, HydraConfig.get().runtime.output_dir)
    except (ConfigError, DataError, RunError, StageError, ResultsError, ValueError) as error:
        print(f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
        raise SystemExit(2) from None
    print(format_table(speedups, REFERENCE))


if __name__ == "__main__":
    main()
