"""lm-evaluation-harness's command line with the `pipespec` model registered.

    python -m experiments.lm_eval --model pipespec \\
        --model_args hierarchy=tiny_k2,strategy=pipespec,lookahead=2 --tasks TASKS [--include_path DIR]
    python -m experiments.lm_eval ls tasks            # lm_eval's other subcommands, unchanged

Every argument is lm_eval's (`lm_eval --help`): this module imports `experiments.lm_eval_model` (which
registers `--model pipespec`), runs lm_eval's own command line, and turns pipespec's configuration and
stage errors into one line.
"""

from __future__ import annotations

import importlib.util
import sys

from pipespec.errors import ConfigError, StageError

# lm_eval and experiments.lm_eval_model (which imports it, and through it torch and transformers) are imported
# in main, once lm-eval is found installed: without it the command says so in one line.

EXTRA = "pipespec[lmeval]"


def main(argv: list[str] | None = None) -> int:
    if importlib.util.find_spec("lm_eval") is None:
        print(f"error: lm-eval is not installed: pip install '{EXTRA}'", file=sys.stderr)
        return 2
    import experiments.lm_eval_model  # noqa: F401  (registers --model pipespec)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    except (ConfigError, StageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
