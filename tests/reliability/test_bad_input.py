"""Bad-input catalogue: mistakes users really make, each caught with an error that names what
is wrong and what to do, before any process starts.

``CATALOGUE`` is the whole list in one place. Mistakes already asserted in
tests/unit/test_config.py are referenced there (a test below checks that each reference still
exists) rather than repeated; every other entry is asserted here, against the public
``notebook_launcher``, with any process start (or an in-process run) failing the test. Hardware we
lack (GPUs, an XLA runtime) is faked at the detection layer only.

Two mistakes can only be seen inside the ranks (the kernel cannot know what a checkpoint holds,
or which branch a rank takes): a world size that does not match the checkpoint, and save_state
called on the main process only. They launch real ranks and must fail fast with the same kind of
message.
"""

from __future__ import annotations

import multiprocessing
import socket
import sqlite3
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

import nbtrain.kernel.host.environment as environment
from nbtrain import WorkerError, notebook_launcher

pytestmark = pytest.mark.timeout(120)

CONFIG_TESTS = Path(__file__).parent.parent / "unit" / "test_config.py"


class ProcessStarted(AssertionError):
    """Something was started although the input was invalid."""


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch):
    """Any rank process, any multiprocessing child, or an in-process run fails the test."""
    import multiprocessing.process

    import nbtrain.kernel.launch.inprocess as inprocess
    import nbtrain.kernel.procs.processes as processes

    def refuse(*args, **kwargs):
        raise ProcessStarted("a process was started although the input was invalid")

    monkeypatch.setattr(processes, "start_ranks", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(inprocess, "run_in_process", refuse)
    children = {child.pid for child in psutil.Process().children(recursive=True)}
    yield
    new = {child.pid for child in psutil.Process().children(recursive=True)} - children
    assert not new, f"processes appeared: {new}"


# ---------------------------------------------------------------------------------------------
# The functions users pass


def train(lr, epochs=1):
    raise AssertionError("the function must not run on bad input")


def _mp_fn(index, flags):  # torch_xla's xmp.spawn convention
    raise AssertionError("the function must not run on bad input")


async def train_async(lr):
    raise AssertionError("the function must not run on bad input")


class Trainer:
    """A notebook object whose bound method is launched: trainer.fit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def fit(self):
        raise AssertionError("the function must not run on bad input")


def lines():
    yield "a line"


def fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int = 2) -> None:
    monkeypatch.setattr(environment, "cuda_device_count", lambda: count)


def fake_initialised_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel used the XLA device (torch_xla's own test: _XLAC._xla_runtime_is_initialized,
    the one xmp.spawn refuses on)."""
    xla = types.ModuleType("torch_xla")
    xla._XLAC = types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla", xla)
    monkeypatch.setitem(sys.modules, "torch_xla._XLAC", xla._XLAC)  # type: ignore[attr-defined]
    monkeypatch.setenv("PJRT_DEVICE", "TPU")


def busy_port() -> tuple[socket.socket, int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, holder.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# The catalogue


@dataclass(frozen=True)
class Mistake:
    name: str
    what: str  # the mistake, as a user would describe it
    call: Callable[[pytest.MonkeyPatch], object] | None = None
    error: type[BaseException] | tuple[type[BaseException], ...] = (TypeError, ValueError)
    says: tuple[str | tuple[str, ...], ...] = ()  # each: a fragment, or alternatives
    covered_by: str = ""  # a fragment of tests/unit/test_config.py that asserts it there
    marks: tuple = field(default=())


def _endpoint_call(endpoint: str, node_rank: int) -> Callable[[pytest.MonkeyPatch], object]:
    return lambda mp: notebook_launcher(
        train,
        (0.1,),
        num_processes=1,
        num_nodes=2,
        node_rank=node_rank,
        rdzv_endpoint=endpoint,
        progress="off",
        rdzv_timeout=30,
    )


NEW = [
    Mistake(
        "args-dict-meant-as-kwargs",
        "args={'lr': 0.1}: keyword arguments passed as args",
        lambda mp: notebook_launcher(train, args={"lr": 0.1}, num_processes=2),
        TypeError,
        ("args={'lr': 0.1}", "kwargs={'lr': 0.1}"),
    ),
    Mistake(
        "one-element-tuple-without-comma",
        "args=('data.csv') is a string, not a tuple",
        lambda mp: notebook_launcher(train, args=("data.csv"), num_processes=2),
        TypeError,
        ("args='data.csv'", "trailing comma", "args=('data.csv',)"),
    ),
    Mistake(
        "accelerate-positional-num-processes",
        "notebook_launcher(train, args, 2) as in Accelerate, where the 3rd parameter is "
        "num_processes (here it is kwargs)",
        lambda mp: notebook_launcher(train, (0.1,), 2),
        TypeError,
        ("kwargs=2", "num_processes=2"),
    ),
    Mistake(
        "async-function",
        "an async def training function",
        lambda mp: notebook_launcher(train_async, (0.1,), num_processes=2),
        TypeError,
        ("async def", "Define it with def"),
    ),
    Mistake(
        "xla-style-index-parameter",
        "_mp_fn(index, flags) written for xmp.spawn, called with args=(flags,)",
        lambda mp: notebook_launcher(_mp_fn, ({"lr": 0.1},), num_processes=2),
        TypeError,
        ("does not pass the rank", "'index'", "int(os.environ['RANK'])"),
    ),
    Mistake(
        "bound-method-holding-a-lock",
        "notebook_launcher(trainer.fit), trainer holds a lock",
        lambda mp: notebook_launcher(Trainer().fit, num_processes=2),
        TypeError,
        ("function.__self__.lock", "cannot be pickled", "inside the function"),
    ),
    Mistake(
        "notebook-global-open-file",
        "the function writes to a file opened in another cell",
        lambda mp: notebook_launcher(NOTEBOOK["train_and_log"], num_processes=2),
        TypeError,
        ("global 'LOG'", "TextIOWrapper", "inside the function"),
    ),
    Mistake(
        "queue-to-collect-results",
        "a multiprocessing.Queue passed to collect results",
        lambda mp: notebook_launcher(train, args=(multiprocessing.Queue(),), num_processes=2),
        TypeError,
        ("args[0]", "Queue", "return them from the function", "return_all=True"),
    ),
    Mistake(
        "generator-argument",
        "a generator passed as data",
        lambda mp: notebook_launcher(train, args=(lines(),), num_processes=2),
        TypeError,
        ("args[0]", "generator", "Pass a list"),
    ),
    Mistake(
        "dataloader-iterator-argument",
        "iter(loader) passed instead of the loader",
        lambda mp: notebook_launcher(train, args=(_loader_iterator(),), num_processes=2),
        TypeError,
        ("args[0]", "Pass the DataLoader itself", "not iter(loader)"),
    ),
    Mistake(
        "database-connection-in-kwargs",
        "an open sqlite3 connection passed as a keyword",
        lambda mp: notebook_launcher(
            train, (0.1,), {"epochs": sqlite3.connect(":memory:")}, num_processes=2
        ),
        TypeError,
        ("kwargs['epochs']", "sqlite3.Connection", "inside the function"),
    ),
    Mistake(
        "progress-false",
        "progress=False to turn the bar off",
        lambda mp: notebook_launcher(train, (0.1,), num_processes=2, progress=False),
        TypeError,
        ("progress=False", "'off'"),
    ),
    Mistake(
        "output-false",
        "output=False to silence the ranks",
        lambda mp: notebook_launcher(train, (0.1,), num_processes=2, output=False),
        TypeError,
        ("output=False", "'none'"),
    ),
    Mistake(
        "mixed-precision-true",
        "mixed_precision=True",
        lambda mp: notebook_launcher(train, (0.1,), num_processes=2, mixed_precision=True),
        TypeError,
        ("mixed_precision=True", "'bf16'"),
    ),
    Mistake(
        "cuda-used-then-fork",
        "CUDA initialised in the kernel, then start_method='fork'",
        lambda mp: (
            fake_gpus(mp),
            mp.setattr(environment, "fork_poisons_cuda", lambda: True),
            notebook_launcher(train, (0.1,), num_processes=2, start_method="fork"),
        ),
        ValueError,
        ("start_method='fork'", "initialised CUDA", "'forkserver'"),
    ),
    Mistake(
        "gpu-id-beyond-visible",
        "gpu_ids=[0, 3] on a machine with 2 GPUs",
        lambda mp: (fake_gpus(mp), notebook_launcher(train, (0.1,), gpu_ids=[0, 3])),
        ValueError,
        ("gpu_ids=[0, 3]", "GPU 3", "only 2 GPU(s)"),
    ),
    Mistake(
        "more-ranks-than-gpu-ids",
        "num_processes=4 with gpu_ids=[0, 1]",
        lambda mp: (
            fake_gpus(mp),
            notebook_launcher(train, (0.1,), num_processes=4, gpu_ids=[0, 1]),
        ),
        ValueError,
        ("num_processes=4", "gpu_ids=[0, 1]", "one GPU per rank"),
    ),
    Mistake(
        "xla-used-before-launch",
        "the XLA device used in the kernel before launching",
        lambda mp: (fake_initialised_xla(mp), notebook_launcher(train, (0.1,), num_processes=2)),
        ValueError,
        ("XLA", "inside the function"),
    ),
    Mistake(
        "busy-rendezvous-port",
        "rdzv_endpoint on this host names a port another program holds",
        None,  # see test_busy_rendezvous_port: the holder must live through the call
    ),
    Mistake(
        "endpoint-with-scheme",
        "rdzv_endpoint='http://10.0.0.1:29400'",
        _endpoint_call("http://10.0.0.1:29400", 1),
        ValueError,
        ("rdzv_endpoint='http://10.0.0.1:29400'", "'HOST:PORT'"),
    ),
    Mistake(
        "endpoint-port-out-of-range",
        "rdzv_endpoint='10.0.0.1:99999'",
        _endpoint_call("10.0.0.1:99999", 1),
        ValueError,
        ("rdzv_endpoint='10.0.0.1:99999'", "1..65535"),
    ),
    Mistake(
        "node-0-elsewhere",
        "node_rank=0 on a machine that is not the endpoint's host",
        _endpoint_call("192.0.2.1:29400", 0),
        ValueError,
        (
            "rdzv_endpoint='192.0.2.1:29400'",
            ("not an address of this machine", "cannot resolve or route"),
            ("Run node_rank=0 on the machine", "Pass node 0's address"),
        ),
    ),
    Mistake(
        "unresolvable-endpoint",
        "a typo in the endpoint's host name",
        _endpoint_call("no-such-host.invalid:29400", 1),
        ValueError,
        ("no-such-host.invalid", "cannot resolve", "Pass node 0's address"),
    ),
    Mistake(
        "checkpoint-world-size",
        "load_state of a checkpoint saved by 2 ranks, on 3 ranks",
        None,  # seen in the ranks only: test_checkpoint_from_another_world_size
    ),
    Mistake(
        "save-state-on-main-only",
        "save_state() under `if accelerator.is_main_process:`",
        None,  # seen in the ranks only: test_save_state_on_the_main_process_only
    ),
]

COVERED = [
    Mistake("function-called", "train() passed instead of train", covered_by="train(1.0)"),
    Mistake("function-none", "function=None", covered_by="notebook_launcher(None)"),
    Mistake("args-scalar", "args=0.1", covered_by="args=0.1"),
    Mistake("kwargs-list", "kwargs=[1]", covered_by="kwargs=[1]"),
    Mistake(
        "missing-argument",
        "a required parameter left out",
        covered_by="do not fit train(lr, epochs=1)",
    ),
    Mistake("too-many-arguments", "more args than parameters", covered_by='"too many"'),
    Mistake("misspelled-keyword", "kwargs={'epoch': 2} for epochs", covered_by='"epoch"'),
    Mistake(
        "rank-parameter",
        "train(rank, lr) as for torch.multiprocessing.spawn",
        covered_by="train_with_rank",
    ),
    Mistake("zero-processes", "num_processes=0", covered_by="num_processes=0"),
    Mistake("negative-processes", "num_processes=-2", covered_by="num_processes=-2"),
    Mistake("fractional-processes", "num_processes=2.5", covered_by="num_processes=2.5"),
    Mistake("string-processes", "num_processes='2'", covered_by="num_processes='2'"),
    Mistake("bool-processes", "num_processes=True", covered_by="num_processes=True"),
    Mistake("unknown-start-method", "start_method='thread'", covered_by="start_method='thread'"),
    Mistake("none-start-method", "start_method=None", covered_by="start_method=None"),
    Mistake("unknown-output", "output='rank0'", covered_by="output='rank0'"),
    Mistake("unknown-progress", "progress='tqdm'", covered_by="progress='tqdm'"),
    Mistake("unknown-precision", "mixed_precision='fp8'", covered_by="mixed_precision='fp8'"),
    Mistake("zero-timeout", "timeout=0", covered_by="timeout=0"),
    Mistake("string-timeout", "timeout='60'", covered_by="timeout='60'"),
    Mistake("int-return-all", "return_all=1", covered_by="return_all=1"),
    Mistake("gpu-ids-without-gpu", "gpu_ids on a CPU-only machine", covered_by="no CUDA GPU"),
    Mistake("duplicate-gpu-ids", "gpu_ids=[0, 0]", covered_by='"twice"'),
    Mistake("zero-nodes", "num_nodes=0", covered_by="num_nodes=0"),
    Mistake(
        "nodes-without-endpoint", "num_nodes=2 without rdzv_endpoint", covered_by='"rdzv_endpoint"]'
    ),
    Mistake("node-rank-too-high", "node_rank=2 of 2 nodes", covered_by="node_rank=2"),
    Mistake("endpoint-without-port", "rdzv_endpoint='nohost'", covered_by="rdzv_endpoint='nohost'"),
    Mistake("negative-restarts", "max_restarts=-1", covered_by="max_restarts=-1"),
    Mistake(
        "lock-argument",
        "a threading.Lock inside an argument",
        covered_by="test_unpicklable_argument_is_named",
    ),
    Mistake(
        "socket-in-closure",
        "a live socket captured by the function",
        covered_by="test_unpicklable_closure_variable_is_named",
    ),
]

CATALOGUE = NEW + COVERED

# Cells of a notebook: code run in __main__, which cloudpickle sends by value with the globals
# it uses (functions of an importable module would travel by reference instead).
NOTEBOOK: dict = {"__name__": "__main__"}
exec("def train_and_log():\n    LOG.write('step\\n')\n", NOTEBOOK)
NOTEBOOK["LOG"] = tempfile.TemporaryFile("w")  # noqa: SIM115 - the log file opened in a cell


def _loader_iterator():
    from torch.utils.data import DataLoader

    return iter(DataLoader(list(range(8)), batch_size=2))


# ---------------------------------------------------------------------------------------------
# Tests


def test_the_catalogue_counts_at_least_twenty_distinct_mistakes():
    names = [mistake.name for mistake in CATALOGUE]
    assert len(set(names)) == len(names), "a mistake is listed twice"
    assert len(NEW) >= 20 and len(CATALOGUE) >= 20


@pytest.mark.parametrize("mistake", COVERED, ids=lambda m: m.name)
def test_reference_to_test_config_still_holds(mistake):
    assert mistake.covered_by in CONFIG_TESTS.read_text(), (
        f"{mistake.name}: tests/unit/test_config.py no longer asserts {mistake.covered_by!r}"
    )


def _says(message: str, says: tuple[str | tuple[str, ...], ...]) -> None:
    for fragment in says:
        options = (fragment,) if isinstance(fragment, str) else fragment
        assert any(option in message for option in options), f"none of {options!r} in {message!r}"


@pytest.mark.parametrize(
    "mistake",
    [pytest.param(m, id=m.name, marks=m.marks) for m in NEW if m.call is not None],
)
def test_mistake_is_refused_before_anything_starts(mistake, monkeypatch, nothing_starts):
    with pytest.raises(mistake.error) as info:
        mistake.call(monkeypatch)
    _says(str(info.value), mistake.says)


def test_busy_rendezvous_port(nothing_starts):
    """Node 0 of a multi-node launch, on a port of this host that another program holds: refused
    before any rank starts, naming the endpoint and what to do. Raised when node 0 opens the
    rendezvous, it is still a ValueError, as API.md promises for bad argument values."""
    holder, port = busy_port()
    try:
        with pytest.raises(ValueError) as info:
            notebook_launcher(
                train,
                (0.1,),
                num_processes=1,
                num_nodes=2,
                node_rank=0,
                rdzv_endpoint=f"127.0.0.1:{port}",
                progress="off",
                rdzv_timeout=30,
            )
    finally:
        holder.close()
    _says(
        str(info.value),
        (f"rdzv_endpoint='127.0.0.1:{port}'", "address already in use", "pick another port"),
    )


# -- seen inside the ranks only ------------------------------------------------------------


def save_with_accelerator(directory: str) -> str:
    import torch

    from nbtrain import Accelerator

    acc = Accelerator()
    acc.register_for_checkpointing(torch.nn.Linear(2, 2))
    return acc.save_state(directory)


def load_with_accelerator(directory: str) -> str:
    import torch

    from nbtrain import Accelerator

    acc = Accelerator()
    acc.register_for_checkpointing(torch.nn.Linear(2, 2))
    return acc.load_state(directory)


def save_on_main_only(directory: str) -> None:
    import torch

    from nbtrain import Accelerator

    acc = Accelerator()
    acc.register_for_checkpointing(torch.nn.Linear(2, 2))
    if acc.is_main_process:
        acc.save_state(directory)
    acc.wait_for_everyone()


QUIET = {"progress": "off", "output": "none"}


def test_checkpoint_from_another_world_size(tmp_path):
    directory = str(tmp_path / "checkpoint")
    notebook_launcher(save_with_accelerator, (directory,), num_processes=2, **QUIET)
    with pytest.raises(WorkerError) as info:
        notebook_launcher(load_with_accelerator, (directory,), num_processes=3, **QUIET)
    assert isinstance(info.value.original, ValueError)
    _says(str(info.value), ("written by 2 rank(s)", "this run has 3", "num_processes=2"))


def test_save_state_on_the_main_process_only(tmp_path):
    """Accelerate hangs here (acc #1171, #2690); nbtrain must name the mistake instead."""
    with pytest.raises(WorkerError) as info:
        notebook_launcher(
            save_on_main_only, (str(tmp_path / "ck"),), num_processes=2, timeout=120, **QUIET
        )
    _says(str(info.value), ("save_state", "wait_for_everyone", "is_main_process"))
