"""How this process was launched, and where the driver and the stage ranks of one pipeline meet.

Three launches (`Pipeline(..., launch=...)`; None picks "torchrun" under torchrun, else "local"):

- "local": the driver starts one process per stage on this machine and serves the store.
- "torchrun": every rank runs the same program (the runner, the bench or a user script); rank 0
  is the driver, rank i (1..k) serves stage i - 1 in place of the program, and exits when the
  driver shuts it down. torchrun's agent already holds MASTER_PORT and serves a TCPStore there
  (TORCHELASTIC_USE_AGENT_STORE=True): every rank connects to it as a client.
- "external": another launcher (srun, a job script) starts `python -m pipespec.worker` on ranks
  1..k; the driver serves the store at the address it is given.

Pure Python and no torch: the stores are made in `pipespec.transport`, the driver's side is
`pipespec.driver`, and a stage rank is served by `pipespec.worker.serve_stage_rank`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass
from typing import Mapping

from pipespec.errors import ConfigError

LAUNCHES = ("local", "torchrun", "external")
UNGUARDED_MAIN_EXIT = 86  # a stage process found itself re-running the user's unguarded main module
GUARD_FIX = 'if __name__ == "__main__":\n    main()'


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """torchrun (torch.distributed.run) sets TORCHELASTIC_RUN_ID in every worker it starts."""
    return "TORCHELASTIC_RUN_ID" in (os.environ if environ is None else environ)


def resolve_launch(launch: str | None, environ: Mapping[str, str] | None = None) -> str:
    if launch is None:
        return "torchrun" if under_torchrun(environ) else "local"
    if launch not in LAUNCHES:
        raise ConfigError(f"launch must be one of {', '.join(map(repr, LAUNCHES))} or None (detect), got {launch!r}")
    return launch


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher (torchrun, or a job script that sets the same variables) tells a rank."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    agent_store: bool  # the launcher's agent serves the store at MASTER_PORT: connect as a client

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "LaunchEnv":
        env = os.environ if environ is None else environ

        def number(name: str, default: str | None = None) -> int:
            value = env.get(name, default)
            if value is None or not value.strip().isdigit():
                raise ConfigError(f"the launcher must set {name} to an integer >= 0, got {value!r}")
            return int(value)

        address = env.get("MASTER_ADDR")
        if not address:
            raise ConfigError("the launcher must set MASTER_ADDR (the host of rank 0 or of torchrun's store)")
        return cls(
            rank=number("RANK"),
            world_size=number("WORLD_SIZE"),
            local_rank=number("LOCAL_RANK", "0"),
            master_addr=address,
            master_port=number("MASTER_PORT"),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    def check_world(self, n_stages: int) -> None:
        """World = the driver + one rank per stage; say the launch command that fits when it does not."""
        if self.world_size != n_stages + 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"this pipeline of {n_stages} stages needs {n_stages + 1} ranks (rank 0 the driver, ranks "
                f"1..{n_stages} the stages), but the launcher started WORLD_SIZE={self.world_size} "
                f"(RANK={self.rank}): e.g. torchrun --nproc_per_node={n_stages + 1}"
            )


def rank_device(device: str, local_rank: int, gpu_count: int) -> str:
    """A stage rank's device: "auto" becomes this rank's own GPU (cuda:LOCAL_RANK) where GPUs exist."""
    if device != "auto":
        return device
    return f"cuda:{local_rank % gpu_count}" if gpu_count else "cpu"


def bootstrapping_child() -> bool:
    """True inside a process multiprocessing is still starting, while it re-imports the user's main
    module (spawn / forkserver): code reached there runs because the module has no __main__ guard."""
    # the flag multiprocessing itself checks (`spawn._check_not_importing_main`); `__mp_main__` alone is
    # not enough: a spawned worker keeps that name for its main module after it has started
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def unguarded_main_message() -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None) or "your script"
    return (
        f"the stage processes re-import the main module ({main}) while starting, and it starts a "
        f"Pipeline again when imported: it needs the `if __name__ == \"__main__\":` guard. Move the "
        f"code that runs the pipeline into a function main() and end the script with\n\n"
        + "\n".join("    " + line for line in GUARD_FIX.splitlines())
    )


def exit_if_bootstrapping_child() -> None:
    """Called where a pipeline is made or started: in a stage process re-running an unguarded main
    module, say why and end that process with UNGUARDED_MAIN_EXIT (the driver turns it into a
    ConfigError with the fix), before it tries to start processes of its own."""
    if bootstrapping_child():
        print(f"pipespec: {unguarded_main_message()}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(UNGUARDED_MAIN_EXIT)
