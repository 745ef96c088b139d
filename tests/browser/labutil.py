"""The JupyterLab / Notebook 7 servers the browser tests share, and the steps every browser test
takes: start Chromium, write a notebook, open it in a page, wait until its kernel is idle, run
its cells.

One server per frontend for the whole session (tests/browser/conftest.py): starting one costs
5-15 s of a loaded 2-core machine, and each test starts its own kernel anyway. Between tests,
``clean`` shuts the test's kernels down and forgets its workspace (JupyterLab would reopen the
last test's notebook, with a kernel of its own) and any per-test setting.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"  # the screenshots: look at them

# Each frontend: how to start its server, and the route that opens a notebook.
APPS = {
    "lab": (["-m", "jupyterlab", "--LabApp.expose_app_in_browser=True"], "lab/tree"),
    "notebook": (
        ["-m", "notebook", "--JupyterNotebookApp.expose_app_in_browser=True"], "notebooks"
    ),
}

# The notebook is the current widget and its kernel is idle: run-all will act on it.
READY_JS = """(path) => {
    const app = window.jupyterapp;
    const widget = app && app.shell.currentWidget;
    const session = widget && widget.sessionContext && widget.sessionContext.session;
    return Boolean(widget && widget.context && widget.context.path === path
                   && session && session.kernel && session.kernel.status === 'idle');
}"""

# Fire and forget: the command's promise resolves only when the cells are done.
RUN_ALL_JS = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"


@dataclass(frozen=True)
class Server:
    app: str  # "lab" or "notebook"
    url: str
    token: str
    root: Path  # the server's root directory: the notebooks
    home: Path  # its JUPYTER_CONFIG_DIR, JUPYTER_DATA_DIR... (config/, data/, ...)

    @property
    def route(self) -> str:
        return APPS[self.app][1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _home(home: Path) -> dict[str, str]:
    """The server's own config, data and kernelspec (the python3 kernel is this interpreter,
    whatever other kernelspecs the machine has), and no news pop-up over the notebook."""
    env = dict(os.environ)
    for name, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                      ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        env[name] = str(home / sub)
        (home / sub).mkdir(parents=True)
    env.pop("JUPYTER_PATH", None)
    spec = home / "data" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python",
    }))
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir()
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
    ))
    return env


@contextlib.contextmanager
def running_server(app: str, base: Path) -> Iterator[Server]:
    """A JupyterLab (``app="lab"``) or Notebook 7 server on a free port, under ``base``."""
    root, home = base / "root", base / "jupyter"
    root.mkdir()
    env = _home(home)
    port, token = _free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    log = base / "server.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, *APPS[app][0], "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             "--allow-root"],
            env=env, stdout=subprocess.DEVNULL, stderr=log_file,
        )
        try:
            _wait_for(url, token, process, log)
            yield Server(app, url, token, root, home)
        finally:
            process.send_signal(signal.SIGTERM)  # also shuts down its kernels
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for(url: str, token: str, process: subprocess.Popen, log: Path) -> None:
    request = urllib.request.Request(
        f"{url}/api/status", headers={"Authorization": f"token {token}"}
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"jupyter server did not answer in 90 s:\n{log.read_text()[-3000:]}")


def api(server: Server, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(
        f"{server.url}/api/{path}", method=method,
        headers={"Authorization": f"token {server.token}"},
        data=b"" if method == "POST" else None,
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        body = answer.read()
    return json.loads(body) if body else None


def shut_down_kernels(server: Server) -> None:
    for session in api(server, "sessions") or []:
        api(server, f"sessions/{session['id']}", "DELETE")  # returns once it is gone


def _settings(server: Server) -> Path:
    return server.home / "config" / "lab" / "user-settings" / "@jupyterlab"


def save_and_shut_down(page: Any, server: Server) -> None:
    """Save the page's notebook, then shut its kernel down: reopened, it gets a fresh one (or,
    untrusted, none)."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    time.sleep(1.5)  # the save reaches the disk
    shut_down_kernels(server)


def render_every_cell(server: Server) -> None:
    """Every cell in the DOM (JupyterLab leaves cells out of view unrendered by default), for
    the pages this test opens next (the server reads its settings at each page load)."""
    tracker = _settings(server) / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')


def clean(server: Server) -> None:
    """After a test: its kernels shut down, its workspace and its settings forgotten."""
    shut_down_kernels(server)
    shutil.rmtree(server.home / "config" / "lab" / "workspaces", ignore_errors=True)
    shutil.rmtree(_settings(server), ignore_errors=True)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (it cannot download its own browser
    here); tests/artifacts/ made for the screenshots."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def write_notebook(server: Server, name: str, cells: list[str]) -> Path:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    path = server.root / name
    nbformat.write(notebook, path)
    return path


def open_notebook(browser: Any, server: Server, name: str, cells: list[str] | None = None, *,
                  height: int = 1000, script: str | None = None, timeout: float = 120) -> Any:
    """A page (1400 px wide) showing notebook ``name`` (written first from ``cells`` if given),
    its kernel idle. ``script``: run in the page before the frontend's own."""
    if cells is not None:
        write_notebook(server, name, cells)
    page = browser.new_page(viewport={"width": 1400, "height": height})
    if script is not None:
        page.add_init_script(script)
    page.goto(f"{server.url}/{server.route}/{name}?token={server.token}")
    page.wait_for_function(READY_JS, arg=name, timeout=timeout * 1000)
    return page
