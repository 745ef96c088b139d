"""Kernels for the tutorial notebooks: the Binder environment, and the XLA environment for 6.

``binder_python`` builds ``.venv-binder`` from exactly ``binder/``'s files, the way repo2docker
does (``pip install -r binder/requirements.txt`` from the repository root, then
``binder/postBuild``), so a broken Binder set-up fails here. The venv is reused while those files
are unchanged (a stamp holds their hash); building it takes a minute or two.

``kernel_dirs`` returns a directory holding a ``python3`` kernelspec for a given interpreter.
The tests put it first on ``JUPYTER_PATH``: the notebooks ask for ``python3`` (what Binder and
Colab provide), and this makes it resolve to the intended interpreter, never to a stale
user-level kernelspec that would silently run another Python.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"
BINDER_FILES = ("runtime.txt", "requirements.txt", "postBuild")
BINDER_VENV = REPO / ".venv-binder"
XLA_VENV = REPO / ".venv-xla"
STAMP = ".binder-files-sha256"

# requirements.txt names PyTorch's CPU index (mybinder.org reaches it). Where it cannot be
# reached, pip would retry it for every package (minutes); one failed try each is enough, since
# the same wheels also come from the configured package sources.
BUILD_ENV = {"PIP_RETRIES": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def binder_digest() -> str:
    digest = hashlib.sha256()
    for name in BINDER_FILES:
        digest.update(name.encode() + b"\0" + (BINDER / name).read_bytes() + b"\0")
    return digest.hexdigest()


def runtime_python() -> str:
    """The interpreter binder/runtime.txt asks for (e.g. python-3.11 -> python3.11)."""
    version = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    found = shutil.which(f"python{version}")
    if found is None:
        pytest.fail(
            f"binder/runtime.txt asks for Python {version}, but python{version} is not on PATH; "
            f"install it (e.g. apt-get install python{version}) to build the Binder environment."
        )
    return found


def build_binder_venv(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, **BUILD_ENV}
    env.pop("VIRTUAL_ENV", None)
    steps = [
        [runtime_python(), "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r",
         "binder/requirements.txt"],
        ["bash", "binder/postBuild"],
    ]
    # postBuild calls `python -m pip`: as on Binder, the environment's python comes first.
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    for command in steps:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(
                f"building the Binder environment failed at `{' '.join(command)}` "
                f"(exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
    (venv / STAMP).write_text(binder_digest())


@pytest.fixture(scope="session")
def binder_python() -> Path:
    """The Python of a venv built from binder/ (rebuilt whenever binder/'s files change)."""
    python = BINDER_VENV / "bin" / "python"
    stamp = BINDER_VENV / STAMP
    if not (python.exists() and stamp.exists() and stamp.read_text() == binder_digest()):
        build_binder_venv(BINDER_VENV)
    return python


def has_module(python: Path, module: str) -> bool:
    """Whether ``module`` is importable by ``python`` (found, not imported: that is quick)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def xla_python() -> Path:
    """The Python of the XLA environment (.venv-xla, see .ci/xla-env.sh); skips without it,
    fails if it is incomplete."""
    here = Path(sys.executable)
    if importlib.util.find_spec("torch_xla") is not None:
        return here
    python = XLA_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(
            "notebook 6 runs on torch_xla's CPU backend in the XLA environment, and "
            f"{python} does not exist: create it with `bash .ci/xla-env.sh`"
        )
    missing = [m for m in ("torch_xla", "ipykernel", "sklearn") if not has_module(python, m)]
    if missing:  # an XLA environment that exists but cannot run it is broken: say so loudly
        pytest.fail(
            f"notebook 6 runs in the XLA environment {python}, which lacks "
            f"{', '.join(missing)}: run `bash .ci/xla-env.sh` to complete it"
        )
    return python


@pytest.fixture(scope="session")
def kernel_dirs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """A JUPYTER_PATH entry whose ``python3`` kernelspec runs the given interpreter."""

    def make(python: Path) -> Path:
        root = tmp_path_factory.mktemp("jupyter")
        spec = root / "kernels" / "python3"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 ({python.parent.parent.name})",
            "language": "python",
        }))
        return root

    return make
