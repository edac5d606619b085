"""torchrun launches the runner on every rank: rank 0 drives, ranks 1..k serve the stages (CPU, gloo loopback)."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipespec.errors import ConfigError
from pipespec.launch import LaunchEnv, rank_device, resolve_launch
from analysis.rundir import read_records

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_launch")
SLOW_FIXTURES = ('greedy',)  # torchrun worlds: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
RUN = ["-m", "experiments.run", "models=tiny_k3", "dataset=humaneval", "run.progress=false"]
SMALL = ["dataset.n_samples=2", "max_new_tokens=8"]
TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def output_ids(run_dir: Path) -> list[list[int]]:
    records, dropped = read_records(run_dir)
    assert dropped == 0 and records
    return [r["output_ids"] for r in sorted(records, key=lambda r: r["index"])]


def torchrun(*launcher_args: str, run_args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [TORCHRUN, *launcher_args, *RUN, *run_args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(process: subprocess.Popen) -> tuple[str, str]:
    out, err = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0, err[-4000:]
    return out, err


@pytest.fixture(scope="module")
def greedy(tmp_path_factory) -> list[list[int]]:
    run_dir = tmp_path_factory.mktemp("greedy")
    result = subprocess.run(
        [sys.executable, *RUN, "strategy=greedy", *SMALL, f"hydra.run.dir={run_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return output_ids(run_dir)


def test_one_torchrun_command_runs_driver_and_three_stage_ranks(greedy, tmp_path):
    run_dir = tmp_path / "run"
    out, _ = finish(torchrun("--standalone", "--nproc_per_node=4",
                             run_args=["strategy=pipespec", *SMALL, f"hydra.run.dir={run_dir}"]))  # fmt: skip
    assert output_ids(run_dir) == greedy
    assert "pipespec" in out and "tiny-target" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the stage ranks wrote nothing


def test_two_torchrun_nodes_meet_at_one_rendezvous(greedy, tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    nodes = [
        torchrun("--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=2", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint={endpoint}", "--rdzv_id=pipespec-test",
                 run_args=["strategy=pipespec", "strategy.lookahead=1", *SMALL, f"hydra.run.dir={run_dir}"])
        for rank in (0, 1)
    ]  # fmt: skip
    outputs = [finish(node) for node in nodes]
    assert output_ids(run_dir) == greedy
    assert sum("tiny-target" in out for out, _ in outputs) == 1  # one driver, on one of the nodes


@pytest.mark.slow
def test_a_killed_stage_rank_is_named_and_every_process_ends(tmp_path):
    run_dir = tmp_path / "run"
    launcher = torchrun("--standalone", "--nproc_per_node=4",
                        run_args=["strategy=pipespec", "dataset.n_samples=100", "max_new_tokens=48",
                                  "run.warmup_tokens=0", f"hydra.run.dir={run_dir}"])  # fmt: skip
    agent = psutil.Process(launcher.pid)
    samples = run_dir / "samples.jsonl"
    deadline = time.monotonic() + TIMEOUT_S
    while not (samples.exists() and samples.stat().st_size > 0):  # generation is under way
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    workers = {int(p.environ().get("RANK", -1)): p for p in agent.children(recursive=True) if "RANK" in p.environ()}
    assert sorted(workers) == [0, 1, 2, 3]
    everything = [agent, *agent.children(recursive=True)]
    killed_at = time.monotonic()
    workers[2].kill()  # rank 2 serves stage 1
    _, err = launcher.communicate(timeout=60)
    elapsed = time.monotonic() - killed_at
    assert launcher.returncode != 0
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith("error: stage 1:"), err[-4000:]  # the dead stage is blamed
    assert elapsed < 10, f"took {elapsed:.1f} s"
    time.sleep(0.5)
    left = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [(p.pid, p.cmdline()[:4]) for p in left]


@pytest.mark.slow
def test_a_world_of_the_wrong_size_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node=3", *RUN, *SMALL, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode != 0
    assert "needs 4 ranks" in result.stderr and "--nproc_per_node=4" in result.stderr, result.stderr[-3000:]


def test_launch_environment():
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29400",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip
    launch = LaunchEnv.from_environ(env)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.agent_store) == (2, 4, 1, True)
    launch.check_world(3)
    with pytest.raises(ConfigError, match="needs 3 ranks"):
        launch.check_world(2)
    with pytest.raises(ConfigError, match="MASTER_PORT"):
        LaunchEnv.from_environ({**env, "MASTER_PORT": "x"})
    assert resolve_launch(None, env) == "torchrun" and resolve_launch(None, {}) == "local"
    with pytest.raises(ConfigError, match="launch must be"):
        resolve_launch("mpi", {})
    assert rank_device("auto", 3, 8) == "cuda:3" and rank_device("auto", 3, 0) == "cpu"
    assert rank_device("cuda:5", 3, 8) == "cuda:5"
