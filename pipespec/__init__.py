"""pipespec: hierarchical speculative decoding (greedy, synchronous chain SD, PipeSpec).

`from pipespec import Pipeline` gives the Python API; the package imports no torch until used.
"""

__all__ = ["Pipeline", "GenerationResult", "StageError", "ConfigError", "StageSpec"]


def __getattr__(name):
    if name in ("Pipeline", "GenerationResult"):
        from pipespec import api

        return getattr(api, name)
    if name in ("ConfigError", "StageError"):
        from pipespec import errors

        return getattr(errors, name)
    if name == "StageSpec":
        from pipespec import specs

        return getattr(specs, name)
    raise AttributeError(name)
