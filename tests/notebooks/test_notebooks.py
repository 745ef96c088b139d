"""Every tutorial notebook runs top to bottom and still produces its stored outputs.

pytest-notebook executes each notebook in a real kernel (notebooks 1-5, 7-9, 11: the Binder
environment, so this also tests binder/; notebook 6: the XLA environment) and diffs the result
against the outputs stored in the file. What legitimately varies from run to run is neutralised
below (or, for a cell, in its ``nbreg`` metadata); everything else, including the deterministic
numbers (accuracies, bitwise comparisons, error messages), must match.

Regenerate the stored outputs after changing a notebook or the dashboard's HTML (then run
again without the flag):

    .venv/bin/python -m pytest tests/notebooks --nb-force-regen
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from pytest_notebook.nb_regression import NBRegressionError, NBRegressionFixture

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
BINDER_NOTEBOOKS = [
    "01_quickstart.ipynb",
    "02_from_ddp_to_nbtrain.ipynb",
    "03_when_things_go_wrong.ipynb",
    "04_checkpoint_and_resume.ipynb",
    "05_accumulation_and_precision.ipynb",
    "07_interactive_ranks.ipynb",
    "08_fsdp.ipynb",
    "09_experiment_tracking.ipynb",
    "11_long_runs.ipynb",
]
XLA_NOTEBOOK = "06_tpu_colab.ipynb"
RAY_NOTEBOOK = "10_ray_cluster.ipynb"  # in the dev environment (nbtrain[ray]), not Binder's
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# Building the Binder venv (first run only) plus a notebook; the limit only stops hangs.
pytestmark = pytest.mark.timeout(900)

DIFF_IGNORE = (
    f"/cells/*/outputs/*/data/{WIDGET_VIEW}",  # widget model ids (stored notebooks drop these)
    # The static dashboard a launch leaves: chart coordinates and timings differ run to run
    # (its content is checked in tests/kernel/test_widgets_kernel.py).
    "/cells/*/outputs/*/data/text/html",
    "/metadata/widgets",  # widget state (stored notebooks drop it: only text/plain is kept)
    "/metadata/language_info/version",  # the interpreter's patch release
)
DIFF_REPLACE = (
    # Optimizer steps per second, in rows and summary ('Done in 1.9s, 84 optimizer steps, 7.0
    # opt steps/s'): timing. The count is exact, but after a stop button's press it follows where
    # the stop landed (as the step below).
    ("/cells/*/outputs", r" \d+(\.\d+)? opt steps/s", ""),
    ("/cells/*/outputs", r"\b\d+ optimizer steps,", "N optimizer steps,"),
    # The summary's rate ('Done in 1.9s, 9.4 it/s (epoch)'; 'steps/s' before it named its loop).
    ("/cells/*/outputs", r", \d+(\.\d+)? (steps|it)/s( \(\w+\))?", ", N it/s"),
    # Speeds and durations in the live view's text summary. A rank's it/s is shown once known,
    # which on a short run can depend on timing: the token goes entirely.
    ("/cells/*/outputs", r" \d+(\.\d+)? it/s", ""),
    ("/cells/*/outputs", r"\d+(\.\d+)? (steps|it)/s", "N it/s"),
    # The launch's log folder a TimeoutError names (a fresh one per launch).
    ("/cells/*/outputs", r"in \S+/rank-N\.log", "in LOGS/rank-N.log"),
    ("/cells/*/outputs", r"\b(in|after) \d+(\.\d+)?s\b", r"\1 Ns"),
    ("/cells/*/outputs", r"ETA \d+:\d\d", "ETA N"),
    ("/cells/*/outputs", r"0x[0-9a-f]{6,}", "0xADDRESS"),
    # The step a stop button's press ends at follows how fast the interrupt reached the ranks
    # (a loaded machine: one step later or earlier); the notebook checks the resumed weights.
    ("/cells/*/outputs", r"\b([Ss]topped at |resumed from checkpoint_\d+ \()step \d+", r"\1step N"),
    # Where a timed-out rank was: a cell's file name is per kernel, library line numbers change.
    ("/cells/*/outputs", r"/tmp/ipykernel_\d+/\d+\.py", "CELL"),
    ("/cells/*/outputs", r"\.py:\d+ in ", ".py:N in "),
    # Tracebacks are compared (the rank's traceback and the direct-cause chain are what notebook
    # 3 teaches), except where installed code lives and its line numbers: in Python's format
    # (a rank's traceback, a stack dump) and as IPython draws a frame of library code (the
    # frame that raised is shown even when hidden; its source lines move with every edit).
    ("/cells/*/outputs", r'"[^"\s]*/(site-packages|nbtrain)/([\w/]+\.py)", line \d+',
     r'"\1/\2", line N'),
    ("/cells/*/outputs", r'"[^"\s]*/lib/python3\.\d+/([\w/]+\.py)", line \d+',
     r'"stdlib/\1", line N'),
    ("/cells/*/outputs/*/traceback", r"^\x1b\[36mFile \x1b\[39m\x1b\[32m[^\x1b]*/"
     r"(nbtrain|site-packages)/[\s\S]*", "LIBRARY FRAME"),
    ("/cells/*/outputs/*/traceback", r"skipping hidden \d+ frame", "skipping hidden N frame"),
)


def strip_for_storage(path: Path) -> None:
    """Keep a regenerated notebook small: no widget state, only the text of widget outputs."""
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_VIEW, None)
    nbformat.write(notebook, path)


def store_dashboards(path: Path, run: nbformat.NotebookNode) -> None:
    """Store the run's static dashboards (HTML, which the diff ignores, so pytest-notebook's
    regeneration never rewrites it) in place of the stored ones, leaving every other output
    as stored: a notebook must not keep showing a dashboard layout fixed long ago."""
    stored = nbformat.read(path, as_version=4)
    changed = False
    for kept, ran in zip(stored.cells, run.cells, strict=True):
        for output, new in zip(kept.get("outputs", []), ran.get("outputs", []), strict=False):
            html = new.get("data", {}).get("text/html")
            same = output.get("output_type") == new.get("output_type") == "display_data"
            if same and "nbtrain-static" in str(html) and output.data.get("text/html") != html:
                output.data["text/html"] = html  # (added where only the text was stored)
                changed = True
    if changed:
        nbformat.write(stored, path)


def check_notebook(
    name: str,
    python: Path,
    kernel_dirs: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    # The notebooks ask for the "python3" kernel: make it this interpreter, and prove it.
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dirs(python)))
    assert KernelSpecManager().get_kernel_spec("python3").argv[0] == str(python)
    regen = bool(request.config.getoption("nb_force_regen", False))
    fixture = NBRegressionFixture(
        exec_timeout=300,  # per cell; only stops hangs
        exec_cwd=str(tmp_path),  # whatever a notebook writes stays out of the repository
        diff_ignore=DIFF_IGNORE,
        diff_replace=DIFF_REPLACE,
        diff_use_color=False,
        force_regen=regen,
    )
    path = NOTEBOOKS / name
    try:
        result = fixture.check(str(path))
    except NBRegressionError:
        if regen:
            strip_for_storage(path)
        raise
    if regen:
        store_dashboards(path, result.nb_final)
    # Run from Jupyter, a notebook's working directory is notebooks/ in the user's clone:
    # whatever it writes belongs in a temporary directory, not beside the notebooks.
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not left, f"{name} left {left} in its working directory: write under tempfile.mkdtemp()"


@pytest.mark.parametrize("name", BINDER_NOTEBOOKS)
def test_notebook_in_binder_environment(
    name, binder_python, kernel_dirs, monkeypatch, request, tmp_path
):
    check_notebook(name, binder_python, kernel_dirs, monkeypatch, request, tmp_path)


def test_tpu_notebook_on_xla_cpu(xla_python, kernel_dirs, monkeypatch, request, tmp_path):
    # torch_xla's CPU backend stands in for the TPU. One device: collectives between several
    # XLA:CPU devices abort upstream (pytorch/xla #5005, #9089; shared/notes/xla-cpu.md), and the
    # workaround that tests/xla uses patches torch_xla internals, which has no place in a tutorial.
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    check_notebook(XLA_NOTEBOOK, xla_python, kernel_dirs, monkeypatch, request, tmp_path)


def test_ray_notebook_on_a_local_two_node_cluster(
    kernel_dirs, monkeypatch, request, tmp_path
):
    # Ray is an extra (nbtrain[ray]) that Binder's image leaves out: this interpreter has it.
    # (Found, not imported: importing Ray here would change this process's environment.)
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install nbtrain[ray])")
    python = Path(sys.executable)
    check_notebook(RAY_NOTEBOOK, python, kernel_dirs, monkeypatch, request, tmp_path)


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(
        [*BINDER_NOTEBOOKS, XLA_NOTEBOOK, RAY_NOTEBOOK]
    )
