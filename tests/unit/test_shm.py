"""The /dev/shm clean-up after killed ranks: only the named processes' torch segments go."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from nbtrain.kernel import shm

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
