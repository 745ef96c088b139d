"""The leak guards' rule (tests/procguard.py) must see what a forkserver launch leaks.

Every rank the forkserver forks carries the server's command line, so the old rule (skip any
process whose command line names the forkserver) was blind to leaked forkserver ranks.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import time

import psutil
import pytest
from procguard import ProcessWatch, helpers

from nbtrain import notebook_launcher

QUIET = {"progress": "off", "output": "none"}


def _kill(processes: dict[int, psutil.Process]) -> None:
    for process in processes.values():
        with contextlib.suppress(psutil.Error):
            process.kill()
            process.wait(10)


def test_a_leaked_forkserver_child_is_counted_and_the_server_is_not():
    notebook_launcher(os.getpid, num_processes=2, start_method="forkserver", **QUIET)  # warm
    watch = ProcessWatch()
    leaked = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(60,))
    leaked.start()
    try:
        found = watch.leaked()
        assert leaked.pid in found, f"a forkserver child went unseen: {watch.describe(found)}"
        server = helpers()
        assert server, "no forkserver/resource tracker found among this process's children"
        assert not server & set(found), "the long-lived forkserver itself counted as a leak"
    finally:
        leaked.kill()
        leaked.join()
    assert watch.leaked() == {}


def leave_an_orphan() -> int | None:
    """Rank 0 starts a child in a process group of its own (so stopping the rank's group misses
    it) and returns: the child outlives the rank, reparented to init (or a subreaper)."""
    if os.environ["RANK"] != "0":
        return None
    return subprocess.Popen(["sleep", "60"], process_group=0).pid


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_an_orphan_of_a_rank_is_counted(method):
    watch = ProcessWatch()
    pid = notebook_launcher(leave_an_orphan, num_processes=2, start_method=method, **QUIET)
    try:
        assert pid not in {c.pid for c in psutil.Process().children(recursive=True)}
        found = watch.leaked()
        assert pid in found, f"the orphan {pid} went unseen: {watch.describe(found)}"
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
        _kill(watch.leaked())
