"""The browser tests' servers: one JupyterLab and one Notebook 7 server for the whole session
(tests/browser/labutil.py), each test's kernels, workspace and settings cleaned after it.

``server``: the server of each frontend (``jupyter`` is parametrized over both;
``@pytest.mark.parametrize("jupyter", ["lab"], indirect=True)`` keeps JupyterLab's). ``lab``:
JupyterLab's, every cell rendered. Session-scoped, the servers
start before each test's leak guard looks at the processes, so they are not counted as leaks;
their kernels are shut down after each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from labutil import APPS, Server, clean, render_every_cell, running_server
from test_dashboard_browser import NOTEBOOK_MISSING
from test_live_view_browser import MISSING


@pytest.fixture(scope="session", params=sorted(APPS))
def jupyter(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Only reached when the browser tests are required (CI) but cannot run (they are skipped
    # otherwise): say what is missing, not jupyterlab's ImportError.
    missing = MISSING or (NOTEBOOK_MISSING if request.param == "notebook" else None)
    if missing is not None:
        pytest.fail(f"CI or NBTRAIN_REQUIRE_BROWSER=1 requires the browser test: {missing}")
    with running_server(request.param, tmp_path_factory.mktemp(request.param)) as server:
        yield server


@pytest.fixture
def server(jupyter: Server) -> Iterator[Server]:
    try:
        yield jupyter
    finally:
        clean(jupyter)


@pytest.fixture
def lab(jupyter: Server) -> Iterator[Server]:
    assert jupyter.app == "lab", 'parametrize("jupyter", ["lab"], indirect=True)'
    render_every_cell(jupyter)
    try:
        yield jupyter
    finally:
        clean(jupyter)
