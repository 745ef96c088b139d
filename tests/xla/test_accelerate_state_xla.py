"""Accelerate's own state in XLA ordinals describes the launch (issue 43, point 7): a bare
``accelerate.PartialState()`` in ordinal 1 of 2 says process 1 of 2, ``DistributedType.XLA``,
not main, on its own device. Accelerate finds that world itself (from torch_xla's runtime, one
state per replica thread); nbtrain only must not spoil it. Skipped where Accelerate is not
installed beside torch_xla (.ci/xla-env.sh does not install it; checked with
``pip install --no-deps --target DIR accelerate`` on PYTHONPATH)."""

from __future__ import annotations

import importlib.util

import pytest

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(180)


def accelerate_state() -> tuple:
    from accelerate import PartialState

    state = PartialState()
    ran: list[int] = []
    state.on_main_process(lambda: ran.append(state.process_index))()
    return (state.process_index, state.num_processes, str(state.distributed_type),
            state.is_main_process, str(state.device), ran)


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                    reason="accelerate is not installed beside torch_xla")
def test_bare_partial_state_in_two_ordinals():
    # (not imported here: Accelerate imports torch_xla, which the launching process must not)
    results = notebook_launcher(accelerate_state, num_processes=2, return_all=True,
                                progress="off")
    assert results == [
        (0, 2, "DistributedType.XLA", True, "xla:0", [0]),
        (1, 2, "DistributedType.XLA", False, "xla:1", []),
    ]
