"""The /dev/shm clean-up after killed ranks: only the named processes' torch segments go."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from nbtrain.kernel.procs import shm

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.isdir("/dev/shm"), reason="Linux only"
)


def test_group_members_are_the_processes_of_that_group():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        assert shm.group_members(child.pid) == {child.pid}
        assert child.pid not in shm.group_members(os.getpgid(0))
    finally:
        child.kill()
        child.wait()


def test_segment_makers_are_the_group_members_named_by_torch_names():
    """What reap() reads instead of every process's stat: the pids of the torch names."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    tag = uuid.uuid4().hex[:8]
    paths = [f"/dev/shm/torch_{pid}_{tag}_0" for pid in (child.pid, os.getpid(), 999999)]
    try:
        assert shm.segment_makers(child.pid) == set(), "no name of the group's yet"
        for path in paths:
            open(path, "w").close()
        assert shm.segment_makers(child.pid) == {child.pid}
    finally:
        child.kill()
        child.wait()
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)


def test_remove_segments_takes_only_the_given_pids_torch_names():
    tag = uuid.uuid4().hex[:8]
    mine = f"/dev/shm/torch_999999_{tag}_0"
    other_pid = f"/dev/shm/torch_999998_{tag}_0"
    not_torch = f"/dev/shm/nbtrain_test_999999_{tag}"
    for path in (mine, other_pid, not_torch):
        open(path, "w").close()
    try:
        assert shm.remove_segments({999999}) == [mine]
        assert not os.path.exists(mine)
        assert os.path.exists(other_pid) and os.path.exists(not_torch)
    finally:
        for path in (mine, other_pid, not_torch):
            if os.path.exists(path):
                os.unlink(path)
