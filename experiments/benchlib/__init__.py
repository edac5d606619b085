"""The bench's library (`python -m experiments.bench` is its entry point).

- `config`: checks of the composed `conf/bench.yaml`, hierarchies, prompts
- `systems`: the compared systems (HF generate in `hf`; our greedy, sd, pipespec) and the pre-passes
- `timer`: the alternating timer and the peak-memory sampler
- `report`: per-stage breakdown, the ideal-pipeline bound, tables and output files
"""
