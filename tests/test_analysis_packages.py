"""The analysis packages split by role (analysis.validate, simulate, predict, fit, rundir): each keeps the names
other modules import from it, its `python -m` entry point, small modules and no import circle among them."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("validate", "simulate", "predict", "fit", "rundir")
# names other modules and tests import from each package (one per role it holds)
IMPORTED = {
    "validate": ("check_sweep", "load_sweep", "SweepReport", "Validation", "repeats", "spearman", "count_values",
                 "_figure", "STEPS", "REFERENCE", "main"),
    "simulate": ("StageCost", "ContextCost", "Bernoulli", "AlongContinuations", "TreeContinuations", "SimResult",
                 "SimulatedStage", "simulate_pipespec", "simulate_sync_sd", "next_action", "buffers"),
    "predict": ("Hierarchy", "Prediction", "predict", "predict_profile", "sweep", "sample_cost", "INTERVAL_Z",
                "SD_WINDOWS", "format_prediction", "sim", "main"),
    "fit": ("estimate_alpha", "fit_step_cost", "CostFit", "measure_traces", "measure_run", "measure_official",
            "paper_tokens_per_s", "at_real_gamma", "LOOKUP_COST_S", "MIN_REGIME_STEPS", "overlap_with"),
    "rundir": ("ResultsError", "RunStore", "read_records", "read_config", "summarize_run", "stage_stats",
               "refresh_reference", "pick_reference", "classify_identity", "near_tie_threshold", "atomic_write_json"),
}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / "analysis" / package).glob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_keeps_the_names_others_import(package):
    module = __import__(f"analysis.{package}", fromlist=["_"])
    assert not (ROOT / "analysis" / f"{package}.py").exists()  # one home: the package
    assert [name for name in IMPORTED[package] if not hasattr(module, name)] == []


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_s_modules_stay_small(package):
    for path in _modules(package):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 600, path
        assert len((ast.get_docstring(tree) or "").splitlines()) <= 16, path
        long = [node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno >= 80]  # fmt: skip
        assert long == [], path


def test_no_module_of_a_package_imports_through_its_package_s_init():
    """A submodule importing `analysis.<package>` itself (not a sibling) would close a circle with __init__."""
    for package in PACKAGES:
        for path in _modules(package):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == f"analysis.{package}":
                    assert False, f"{path}: imports from analysis.{package}; import the sibling module instead"


@pytest.mark.parametrize("package", ["validate", "predict"])
def test_python_m_keeps_working(package):
    done = subprocess.run([sys.executable, "-m", f"analysis.{package}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith(f"usage: python -m analysis.{package}")
    assert "torch" not in subprocess.run(
        [sys.executable, "-c", f"import sys, analysis.{package}; print(sorted(sys.modules))"], cwd=ROOT,
        capture_output=True, text=True, timeout=120).stdout.split("'")  # fmt: skip
