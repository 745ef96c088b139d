"""Argument validation: every mistake is caught before any process starts, and the message
names the argument, the value and what to pass instead."""

from __future__ import annotations

import threading

import pytest

from nbtrain import notebook_launcher, start_ranks
from nbtrain.kernel.options.config import StartMethod, choose_start_method


def train(lr, epochs=1):
    return lr * epochs


def train_with_rank(rank, lr):
    return rank * lr


@pytest.fixture(autouse=True)
def no_process_starts(monkeypatch: pytest.MonkeyPatch):
    """Validation must fail before anything starts: make any start an immediate test failure."""
    import nbtrain.kernel.procs.processes as processes

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started although the arguments were invalid")

    monkeypatch.setattr(processes, "start_ranks", refuse)


@pytest.mark.parametrize(
    ("call", "error", "fragments"),
    [
        (
            lambda: notebook_launcher(train(1.0), args=(1,)),
            TypeError,
            ["function=1.0", "not callable", "train()"],
        ),
        (lambda: notebook_launcher(None), TypeError, ["function=None", "not callable"]),
        (
            lambda: notebook_launcher(train, args=0.1),
            TypeError,
            ["args=0.1", "tuple", "args=(0.1,)"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), kwargs=[1]),
            TypeError,
            ["kwargs=[1]", "dict"],
        ),
        (lambda: notebook_launcher(train), TypeError, ["do not fit train(lr, epochs=1)", "lr"]),
        (lambda: notebook_launcher(train, args=(1, 2, 3)), TypeError, ["do not fit", "too many"]),
        (
            lambda: notebook_launcher(train, args=(1,), kwargs={"epoch": 2}),
            TypeError,
            ["do not fit", "epoch"],
        ),
        (
            lambda: notebook_launcher(train_with_rank, args=(0.1,)),
            TypeError,
            ["does not pass the rank", "Accelerator().process_index"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=0),
            ValueError,
            ["num_processes=0", ">= 1"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=-2),
            ValueError,
            ["num_processes=-2"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2.5),
            TypeError,
            ["num_processes=2.5", "whole number"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes="2"),
            TypeError,
            ["num_processes='2'"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=True),
            TypeError,
            ["num_processes=True"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, start_method="thread"),
            ValueError,
            ["start_method='thread'", "'fork'", "'spawn'"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, start_method=None),
            TypeError,
            ["start_method=None"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, output="rank0"),
            ValueError,
            ["output='rank0'", "'main'"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, progress="tqdm"),
            ValueError,
            ["progress='tqdm'", "'widgets'", "'text'"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, mixed_precision="fp8"),
            ValueError,
            ["mixed_precision='fp8'", "'bf16'"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, timeout=0),
            ValueError,
            ["timeout=0", "> 0"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, timeout="60"),
            TypeError,
            ["timeout='60'"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, hang_after=0),
            ValueError,
            ["hang_after=0", "> 0", "hang_after=None to turn hang detection off"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, hang_after="5m"),
            TypeError,
            ["hang_after='5m'", "not a number of seconds"],
        ),
        (
            lambda: start_ranks(2, hang_after=float("inf")),
            ValueError,
            ["hang_after=inf", "finite"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, return_all=1),
            TypeError,
            ["return_all=1"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, gpu_ids=[0, 1]),
            ValueError,
            ["gpu_ids=[0, 1]", "no CUDA GPU"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_processes=2, gpu_ids=[0, 0]),
            ValueError,
            ["gpu_ids=[0, 0]", "twice"],
        ),
        (lambda: notebook_launcher(train, args=(1,), num_nodes=0), ValueError, ["num_nodes=0"]),
        (
            lambda: notebook_launcher(train, args=(1,), num_nodes=2),
            ValueError,
            ["num_nodes=2", "rdzv_endpoint"],
        ),
        (
            lambda: notebook_launcher(
                train, args=(1,), num_nodes=2, node_rank=2, rdzv_endpoint="h:1"
            ),
            ValueError,
            ["node_rank=2", "below"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), num_nodes=2, rdzv_endpoint="nohost"),
            ValueError,
            ["rdzv_endpoint='nohost'", "HOST:PORT"],
        ),
        (
            lambda: notebook_launcher(train, args=(1,), max_restarts=-1),
            ValueError,
            ["max_restarts=-1"],
        ),
    ],
)
def test_bad_argument_is_named_with_a_fix(call, error, fragments):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_unpicklable_argument_is_named():
    lock = threading.Lock()
    with pytest.raises(TypeError) as info:
        notebook_launcher(train, args=({"opt": [1, lock]},), num_processes=2)
    message = str(info.value)
    assert "args[0]['opt'][1]" in message
    assert "lock" in message.lower()
    assert "inside the function" in message


def test_unpicklable_closure_variable_is_named():
    import socket

    handle = socket.socket()  # a live connection cannot travel to another process
    try:

        def uses_socket():
            return handle.fileno()

        with pytest.raises(TypeError) as info:
            notebook_launcher(uses_socket, num_processes=2)
        assert "closure variable 'handle'" in str(info.value)
    finally:
        handle.close()


def test_auto_start_method_prefers_fork_on_linux_without_cuda():
    choice = choose_start_method("auto", uses_cuda=False)
    assert choice.method is StartMethod.FORK
    assert "CUDA" in choice.reason


def test_fork_refused_when_cuda_would_be_unusable(monkeypatch):
    """CUDA availability is hardware we lack: fake the probe, not the decision under test."""
    import nbtrain.kernel.host.environment as environment

    monkeypatch.setattr(environment, "fork_poisons_cuda", lambda: True)
    with pytest.raises(ValueError, match="forkserver"):
        choose_start_method("fork", uses_cuda=True)
    assert choose_start_method("auto", uses_cuda=True).method is StartMethod.FORKSERVER
    # CPU-only ranks are unaffected by a CUDA context in the parent.
    assert choose_start_method("auto", uses_cuda=False).method is StartMethod.FORK


def test_the_precise_cuda_fork_probe_runs_and_clears_fork_here(monkeypatch):
    """Only the hardware fact is faked (this process 'has initialised CUDA'); the probe itself
    really forks and asks the child whether torch considers it a bad fork. On this CPU-only
    machine no CUDA context exists, so the answer is 'not poisoned' and auto keeps fork."""
    import os

    import nbtrain.kernel.host.environment as environment

    forks = []
    real_fork = os.fork

    def counting_fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(environment, "cuda_initialized", lambda: True)
    monkeypatch.setattr(os, "fork", counting_fork)  # counts, still forks for real
    assert environment.fork_poisons_cuda() is False
    assert forks == [1], "the probe did not fork"
    choice = choose_start_method("auto", uses_cuda=True)
    assert choice.method is StartMethod.FORK, choice.reason
    assert choose_start_method("fork", uses_cuda=True).method is StartMethod.FORK
