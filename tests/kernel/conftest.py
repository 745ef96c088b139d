"""Real Jupyter kernels for tests, always running this interpreter (the venv's python).

The kernelspec comes from ``kernelutil.write_kernelspec`` (a temporary directory found through a
KernelSpecManager), so a stale user-level ``python3`` spec can never be picked up and
os.environ is left alone. For driving a kernel with jupyter_client, see ``kernelutil.Kernel``.

Fixtures:
- ``kernel_spec_manager`` (session): the KernelSpecManager that knows KERNEL_NAME.
- ``run_notebook``: run code cells with nbclient (widget state stored) and return the notebook;
  the widget models are then in ``notebook.metadata["widgets"]``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from kernelutil import KERNEL_NAME, write_kernelspec
from nbclient import NotebookClient


@pytest.fixture(scope="session")
def kernel_spec_manager(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    manager = write_kernelspec(tmp_path_factory.mktemp("kernels"))
    assert manager.get_kernel_spec(KERNEL_NAME).argv[0] == sys.executable
    return manager


@pytest.fixture
def run_notebook(
    kernel_spec_manager: KernelSpecManager, tmp_path: Path
) -> Callable[..., nbformat.NotebookNode]:
    def run(cells: list[str], *, timeout: int = 240) -> nbformat.NotebookNode:
        notebook = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(source) for source in cells]
        )
        manager = AsyncKernelManager(
            kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_spec_manager
        )
        client = NotebookClient(
            notebook, km=manager, kernel_name=KERNEL_NAME, timeout=timeout,
            store_widget_state=True,
        )
        client.execute(cleanup_kc=True, cwd=str(tmp_path))  # shuts the kernel down after
        return notebook

    return run
