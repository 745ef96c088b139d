"""Shared fixtures. Autouse guards fail any test that leaks child processes, threads or
environment variables: the launcher promises to leave nothing behind."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import psutil
import pytest
import torch._dynamo  # noqa: F401 - sets TORCHINDUCTOR_CACHE_DIR once; the launcher imports it too
from procguard import ProcessWatch

# Every kernel the suite starts (Jupyter clients, notebooks, browsers) inherits this: without
# it, each kernel that imports nbtrain would warm up (kernel/procs/warmup.py), a forkserver
# importing torch included: minutes of CPU over the suite on CI's two cores. The warm-up's own tests
# (tests/kernel/test_warmup_kernel.py, the SIGKILL test) turn it back on in their kernels.
os.environ.setdefault("NBTRAIN_WARM_UP", "0")

# Threads that libraries start once per process and keep (not per launch): sentry's worker
# is started by the tracker libraries that report to Sentry (comet_ml, wandb).
_LONG_LIVED_THREADS = (
    "pydevd",
    "IPythonHistorySavingThread",
    "ThreadPoolExecutor",
    "sentry-sdk.BackgroundWorker",
)


def _threads() -> set[int]:
    return {
        t.ident
        for t in threading.enumerate()
        if t.ident is not None and not t.name.startswith(_LONG_LIVED_THREADS)
    }


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest):
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    env_before = _environment()
    processes = ProcessWatch()  # ranks of forkserver launches and orphans count (procguard.py)
    threads_before = _threads()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leaked_children = processes.leaked()
        leaked_threads = _threads() - threads_before
        if not leaked_children and not leaked_threads:
            break
        time.sleep(0.1)
    env_after = _environment()
    changed = {k for k in set(env_before) | set(env_after) if env_before.get(k) != env_after.get(k)}
    problems = []
    if leaked_children:
        described = processes.describe(leaked_children)
        for process in leaked_children.values():
            with contextlib.suppress(psutil.Error):
                process.kill()  # do not poison the tests that follow
        problems.append(f"leaked child processes: {described}")
    if leaked_threads:
        names = [t.name for t in threading.enumerate() if t.ident in leaked_threads]
        problems.append(f"leaked threads: {names}")
    if changed:
        problems.append(f"changed environment variables: {sorted(changed)}")
    if problems:
        pytest.fail("; ".join(problems))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_leaks: skip the leak guard for this test")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
