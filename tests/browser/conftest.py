"""The browser tests' servers: one JupyterLab and one Notebook 7 server for the whole session
(tests/browser/labutil.py), each test's kernels, workspace and settings cleaned after it.

``server``: the server of each frontend (``jupyter`` is parametrized over both;
``@pytest.mark.parametrize("jupyter", ["lab"], indirect=True)`` keeps JupyterLab's). ``lab``:
JupyterLab's, every cell rendered. Session-scoped, the servers start before each test's leak guard
looks at the processes, so they are not counted as leaks; their kernels are shut down after each
test, and the servers after the last browser test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from labutil import APPS, Server, clean, render_every_cell, running_server
from test_dashboard_browser import NOTEBOOK_MISSING
from test_live_view_browser import MISSING

# The running servers, by frontend. A session-wide fixture lives until the session ends; these
# are stopped after the last test that uses one (pytest_runtest_teardown), not left idle while
# the rest of the suite runs.
_RUNNING: dict[str, contextlib.ExitStack] = {}


def _stop(app: str | None = None) -> None:
    for name in [app] if app else list(_RUNNING):
        stack = _RUNNING.pop(name, None)
        if stack is not None:
            stack.close()


@pytest.fixture(scope="session", params=sorted(APPS))
def jupyter(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Only reached when the browser tests are required (CI) but cannot run (they are skipped
    # otherwise): say what is missing, not jupyterlab's ImportError.
    missing = MISSING or (NOTEBOOK_MISSING if request.param == "notebook" else None)
    if missing is not None:
        pytest.fail(f"CI or NBTRAIN_REQUIRE_BROWSER=1 requires the browser test: {missing}")
    stack = _RUNNING[request.param] = contextlib.ExitStack()
    yield stack.enter_context(running_server(request.param, tmp_path_factory.mktemp(request.param)))
    _stop(request.param)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield
    if _RUNNING and "jupyter" in getattr(item, "fixturenames", ()):
        items = item.session.items
        later = items[items.index(item) + 1:]
        if not any("jupyter" in getattr(other, "fixturenames", ()) for other in later):
            _stop()
    return result


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
