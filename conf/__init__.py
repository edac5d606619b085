"""pipespec's Hydra configuration tree, installed as the package `pipespec_conf`.

Entry points compose it with `@hydra.main(config_path="pkg://pipespec_conf", ...)`, every other
reader through `experiments.compose` (Hydra's compose API). Groups: `models/` (hierarchies),
`strategy/`, `dataset/`, `experiment/` (whole runs: deltas over `config.yaml`), `hydra/`; primary
configs: `config.yaml` (runner), `bench.yaml`, `profile.yaml`.
"""
