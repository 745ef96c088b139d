"""What the README tells a newcomer to run works as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_in_a_notebook_snippet_runs_as_it_stands(tmp_path: Path):
    section = README.split("## In a notebook", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None, "the section lost its code block"
    script = tmp_path / "snippet.py"
    script.write_text(
        snippet.group(1)
        + "\nassert set(weights) == {'0.weight', '0.bias', '2.weight', '2.bias'}, weights.keys()"
        + "\nprint('snippet ok')\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "snippet ok" in done.stdout


def test_the_torch_pin_is_met_by_pypi_and_by_the_cpu_build_on_disk():
    # The README's first command must work on a laptop (PyPI: 2.13.0) and here (a local
    # 2.13.0+cpu wheel, which pip prefers: a local version sorts after its public one).
    pins = [
        Requirement(line)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    torch = next(pin for pin in pins if pin.name == "torch")
    assert torch.specifier.contains("2.13.0"), torch
    assert torch.specifier.contains("2.13.0+cpu"), torch


def first_code_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block is not None, "the README lost its commands"
    return block.group(1).strip().splitlines()


def test_the_readme_starts_with_the_two_commands():
    # Nothing but the title and a short description before them: they are the first screen.
    assert README.index("```bash") < 600
    setup, tests = first_code_block()
    assert setup == (
        "python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt "
        "-e '.[notebooks]' && .venv/bin/nbtrain demo"
    )
    assert tests == "bash .ci/test.sh"
    assert "bash .ci/test.sh" in (REPO / ".ci" / "run").read_text()  # what CI runs
    # ... and the notebooks are one command away from the first.
    assert "`.venv/bin/jupyter lab notebooks/`" in README[:3000]


def test_the_demo_ends_with_the_line_the_readme_quotes():
    quoted = re.search(r"ending with a line like\s+`(Result: [^`]+)`", README)
    assert quoted is not None, "the README no longer quotes the demo's last line"
    done = subprocess.run(
        [sys.executable, "-m", "nbtrain", "demo"], capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]

    def shape(line: str) -> str:  # times vary by machine; the words and the rest must not
        return re.sub(r"\d[\d,.]*", "N", line)

    assert shape(last) == shape(quoted.group(1)), (last, quoted.group(1))


NOTEBOOKS = REPO / "notebooks"
TPU_NOTEBOOK = "06_tpu_colab.ipynb"  # runs on a TPU runtime (torch_xla), not in the extra
# Notebooks that need another extra too (their **Needs:** line names it): what it installs.
EXTRA_NOTEBOOKS = {"10_ray_cluster.ipynb": "ray"}


def imported_distributions(notebook: Path) -> set[str]:
    """The installed distributions that a notebook's code cells import."""
    import importlib.metadata

    import nbformat

    providers = importlib.metadata.packages_distributions()
    code = "\n".join(
        cell.source for cell in nbformat.read(notebook, 4).cells if cell.cell_type == "code"
    )
    modules = {m.split(".")[0] for m in re.findall(r"^\s*(?:from|import) ([\w.]+)", code, re.M)}
    return {
        canonical(providers[module][0])
        for module in modules - set(sys.stdlib_module_names)
        if module in providers
    } | ({"nbtrain"} if "nbtrain" in modules else set())


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_notebooks_extra_installs_what_the_notebooks_import():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = {canonical(Requirement(r).name) for r in project["optional-dependencies"]["notebooks"]}
    base = {canonical(Requirement(r).name) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert {"jupyterlab", "ipykernel"} <= extra  # a kernel and the app to open them in
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        if notebook.name == TPU_NOTEBOOK:
            continue
        needed = imported_distributions(notebook) - {"nbtrain"}
        assert needed, f"{notebook.name}: found no imports (the check is broken)"
        other = EXTRA_NOTEBOOKS.get(notebook.name)
        if other is not None:
            needed -= {canonical(Requirement(r).name) for r in extras[other]}
        assert needed <= extra | base, f"{notebook.name} imports {needed - extra - base}"


def test_each_notebook_says_what_it_needs_in_its_first_cell():
    import nbformat

    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        first = nbformat.read(notebook, 4).cells[0]
        needs = re.search(r"\*\*Needs:\*\*([^\n]*)", first.source)
        assert first.cell_type == "markdown" and needs, f"{notebook.name}: no **Needs:** line"
        said = canonical(needs.group(1))
        missing = [d for d in imported_distributions(notebook) if d not in said]
        assert not missing, f"{notebook.name}'s first cell does not name {missing}"
