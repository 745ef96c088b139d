"""Several XLA:CPU ordinals (threads of one host process): every ordinal is a rank of its own for
results, output and failures; the host checks that torch_xla started the ordinals the kernel
expects. No cross-replica collectives here (see support.py for why those need a test-only
workaround on XLA:CPU)."""

from __future__ import annotations

import time

import pytest

from nbtrain import WorkerError, notebook_launcher
from nbtrain.kernel.launch import xla

pytestmark = pytest.mark.timeout(180)


def whoami(scale):
    import torch_xla
    import torch_xla.runtime as xr

    from nbtrain.rank import runtime

    info = runtime.current().info
    x = torch_xla.device()
    print(f"line from ordinal {info.rank}")
    assert info.rank == xr.global_ordinal() and info.world_size == xr.world_size()
    return info.rank * scale, str(x)


def one_fails():
    from nbtrain.rank import runtime

    rank = runtime.current().info.rank
    if rank == 2:
        raise ValueError("ordinal 2 broke")
    time.sleep(60)  # the others would wait: the launch must end at once anyway


def test_every_ordinal_returns_and_prints_as_its_own_rank(capfd):
    results = notebook_launcher(whoami, (10,), num_processes=4, return_all=True, progress="off")
    assert [value for value, _ in results] == [0, 10, 20, 30]
    assert sorted(device for _, device in results) == ["xla:0", "xla:1", "xla:2", "xla:3"]
    out = capfd.readouterr().out
    for rank in range(4):
        assert f"[rank {rank}] line from ordinal {rank}" in out


def test_a_failing_ordinal_is_the_root_cause_and_ends_the_launch():
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(one_fails, num_processes=4, progress="off")
    assert info.value.rank == 2 and "ordinal 2 broke" in str(info.value)
    assert time.monotonic() - started < 45


def test_more_ordinals_than_the_kernel_expects_fail_fast_by_name(monkeypatch):
    # Stands in for a TPU host where torch_xla finds other chips than nbtrain counted in the
    # kernel (or one host of a pod slice): the host's runtime starts 3 devices for 2 ordinals.
    real = xla.host_env

    def three_devices(config):
        return {**real(config), "CPU_NUM_DEVICES": "3"}

    monkeypatch.setattr(xla, "host_env", three_devices)
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(whoami, (1,), num_processes=2, progress="off")
    text = str(info.value)
    assert info.value.rank == 0
    assert "torch_xla started 3 XLA ordinal(s) on this host, but nbtrain expected 2" in text
    assert "CPU_NUM_DEVICES=2, from num_processes" in text and "num_processes=1" in text
    assert "line from ordinal" not in text  # stopped before the function ran
    assert time.monotonic() - started < 45


def total_of(array):
    from nbtrain.rank import runtime

    return runtime.current().info.rank, float(array.sum())


def test_big_arguments_reach_the_ordinals_through_shared_memory(monkeypatch):
    """A 64 MiB argument travels once through /dev/shm to the host process (the pickle the host
    receives is small), and nothing of it is left there afterwards."""
    import glob
    import os

    import numpy as np

    sent = []
    real = xla.run_xla

    def watched(config, call):
        sent.append((len(call.data), call.shared_bytes))
        return real(config, call)

    monkeypatch.setattr(xla, "run_xla", watched)
    big = np.ones(8 << 20)  # 64 MiB of float64
    results = notebook_launcher(total_of, (big,), num_processes=2, return_all=True,
                                progress="off")
    assert results == [(0, float(big.size)), (1, float(big.size))]
    [(pickled, shared)] = sent
    assert pickled < (1 << 20) and shared >= big.nbytes, sent
    assert glob.glob(f"/dev/shm/nbtrain_{os.getpid()}_*") == []
