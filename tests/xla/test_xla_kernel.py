"""The XLA launch path from a REAL Jupyter kernel (this interpreter: .venv-xla), single ordinal:
train with the Accelerator, results, failure, interrupt + relaunch, checkpoint round trip (with
dropout drawing on the device), bf16, and equality with the CPU Accelerator's result. The kernel
never imports torch_xla."""

from __future__ import annotations

import time

import psutil
import pytest
from kernelutil import Kernel, running_kernel

pytestmark = pytest.mark.timeout(300)

SETUP = """
import os, sys, time, torch
os.environ["PJRT_DEVICE"] = "CPU"
from nbtrain import Accelerator, WorkerError, debug_launcher, notebook_launcher, set_seed

def train(steps, cpu=False, save=None, load=None, mixed_precision=None, dropout=0.0):
    accelerator = Accelerator(cpu=cpu, mixed_precision=mixed_precision)
    set_seed(0)
    layers = [torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)]
    if dropout:
        layers.insert(2, torch.nn.Dropout(dropout))  # draws from the device's generator
    model = torch.nn.Sequential(*layers)
    inner = set()  # the dtype the first matmul really runs in
    model[0].register_forward_hook(lambda module, args, out: inner.add(str(out.dtype)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(48, 4, generator=g),
                                          torch.randn(48, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if load:
        accelerator.load_state(load)
    done, losses = 0, []
    while done < steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
            done += 1
            if done == steps:
                break
    if save:
        accelerator.save_state(save)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {"device": str(accelerator.device), "type": str(accelerator.distributed_type.value),
            "precision": accelerator.mixed_precision, "state": state,
            "losses": [float(l) for l in losses], "inner": sorted(inner)}

def same(a, b, atol=1e-5):
    return all(torch.allclose(a[k], b[k], atol=atol) for k in a) and a.keys() == b.keys()

def same_bits(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
"""


def hosts(kernel: Kernel) -> list[psutil.Process]:
    """Live processes under the kernel other than its helpers (XLA launches start their host
    from the forkserver, so its children count, unlike kernelutil's live_children)."""
    alive = []
    for child in psutil.Process(kernel.pid).children(recursive=True):
        try:
            helper = child.ppid() == kernel.pid and any(
                name in " ".join(child.cmdline()) for name in ("forkserver", "resource_tracker")
            )
            if child.status() != psutil.STATUS_ZOMBIE and not helper:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_notebook_function_trains_on_xla_and_matches_the_cpu_accelerator(kernel, method):
    out = kernel.run(f"""
xla = notebook_launcher(train, args=(10,), start_method="{method}", progress="text")
cpu = debug_launcher(train, args=(10, True), num_processes=1)
""")
    assert out.error is None, out.traceback_text
    assert kernel.value("(xla['device'], xla['type'], cpu['type'])") == ("xla:0", "XLA", "NO")
    assert kernel.value("len(xla['losses'])") == 10
    assert kernel.value("same(xla['state'], cpu['state'])") is True
    assert kernel.value("max(abs(a - b) for a, b in zip(xla['losses'], cpu['losses']))") < 1e-4
    # It trains: the second pass over the data (batches 7-10) has a lower mean loss than the
    # first (batches 1-6); single batches are too noisy to compare (the order is seeded).
    assert kernel.value("sum(xla['losses'][6:]) / 4 < sum(xla['losses'][:6]) / 6") is True
    # The kernel only supervised: the XLA runtime lived in the host process, which is gone.
    assert kernel.value("'torch_xla' in sys.modules") is False
    assert hosts(kernel) == []


def test_output_is_attributed_to_the_ordinal(kernel):
    out = kernel.run("""
def hello():
    print("hello from the ordinal")
    print("to stderr", file=sys.stderr)
    return 7
print("value", notebook_launcher(hello, progress="off"))
""")
    assert out.error is None, out.traceback_text
    assert "[rank 0] hello from the ordinal" in out.stdout
    assert "to stderr" in out.stderr
    assert "value 7" in out.stdout


def test_failure_is_a_worker_error_with_the_ordinals_traceback(kernel):
    out = kernel.run("""
def broken():
    x = torch.ones(2, device=Accelerator().device)
    raise ValueError(f"bad batch on {x.device}")
notebook_launcher(broken, progress="text")
""")
    assert out.error is not None and out.error["ename"] == "WorkerError"
    assert "rank 0" in out.error["evalue"] and "bad batch on xla:0" in out.error["evalue"]
    # The ordinal's own traceback is shown in the cell, down to the user's function (under the
    # forkserver the host has no copy of the cell's source, so frames show without lines).
    assert "ValueError in rank 0" in out.traceback_text and "broken" in out.traceback_text
    assert hosts(kernel) == []


def test_interrupt_stops_the_host_and_relaunch_works(kernel):
    msg_id = kernel.start("""
def forever():
    x = torch.ones(1, device=Accelerator().device)
    print("ordinal running", flush=True)
    while True:
        x = x + 1
        time.sleep(0.05)
notebook_launcher(forever, progress="text")
""")
    kernel.collect(msg_id, timeout=90, until="ordinal running")
    assert hosts(kernel)
    kernel.manager.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    deadline = time.monotonic() + 10
    while hosts(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hosts(kernel) == []
    # No "Runtime is already initialized": every launch gets a fresh host process.
    again = kernel.run('print(notebook_launcher(train, args=(2,), progress="off")["device"])')
    assert again.error is None, again.traceback_text
    assert "xla:0" in again.stdout


def test_checkpoint_round_trip_resumes_exactly(kernel, tmp_path):
    ckpt = tmp_path / "ckpt"
    out = kernel.run(f"""
straight = notebook_launcher(train, args=(9,), kwargs=dict(dropout=0.3), progress="off")
first = notebook_launcher(
    train, args=(4,), kwargs=dict(save={str(ckpt)!r}, dropout=0.3), progress="off"
)
resumed = notebook_launcher(
    train, args=(5,), kwargs=dict(load={str(ckpt)!r}, dropout=0.3), progress="off"
)
plain = notebook_launcher(train, args=(9,), progress="off")
""")
    assert out.error is None, out.traceback_text
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "optimizer.bin").is_file()
    # Model, Adam moments, the shuffled loader's position and the device's dropout generator
    # all came back: 4 + 5 == 9, bit for bit.
    assert kernel.value("same_bits(resumed['state'], straight['state'])") is True
    assert kernel.value("resumed['losses'] == straight['losses'][4:]") is True
    assert kernel.value("first['losses'] == straight['losses'][:4]") is True
    assert kernel.value("straight['losses'] != plain['losses']") is True  # dropout did draw


def test_bf16_mixed_precision(kernel):
    out = kernel.run("""
bf16 = notebook_launcher(train, args=(6,), mixed_precision="bf16", progress="off")
""")
    assert out.error is None, out.traceback_text
    assert kernel.value("bf16['precision']") == "bf16"
    assert kernel.value("bf16['inner']") == ["torch.bfloat16"]  # the matmul ran in bf16 ...
    # ... and the outputs, weights and losses are float32 (Accelerate's convert_to_fp32).
    assert kernel.value("all(v.dtype == torch.float32 for v in bf16['state'].values())") is True
    assert kernel.value("all(l == l for l in bf16['losses'])") is True  # no NaN
    full = kernel.run('fp32 = notebook_launcher(train, args=(1,), progress="off")')
    assert full.error is None, full.traceback_text
    assert kernel.value("fp32['inner']") == ["torch.float32"]


def test_a_background_run_stops_with_nothing_left_and_trains_as_the_blocking_one(kernel):
    """block=False on XLA: the host process is watched from a thread of the kernel like local
    ranks; cells answer meanwhile with none of its output; run.stop() takes the host down; the
    value equals the blocking launch's, bit for bit."""
    out = kernel.run("""
def counting():
    x = torch.ones(1, device=Accelerator().device)
    for i in range(10_000):
        print(f"count {i}", flush=True)
        x = x + 1
        time.sleep(0.05)
run = notebook_launcher(counting, progress="off", block=False)
""")
    assert out.error is None, out.traceback_text
    assert "count" not in out.stdout
    deadline = time.monotonic() + 90
    while not kernel.value("len(run.output())"):
        assert time.monotonic() < deadline, kernel.value("run.status")
        time.sleep(0.2)
    meanwhile = kernel.run("print('cell'); time.sleep(0.5); print(run.status)")
    assert meanwhile.stdout == "cell\nrunning\n" and not meanwhile.stderr
    assert hosts(kernel)
    stopped = kernel.run("run.stop(); run.wait(timeout=60)")
    assert stopped.error is not None and stopped.error["ename"] == "KeyboardInterrupt"
    assert kernel.value("(run.status, run.output()[0])") == ("stopped", "[rank 0] count 0")
    deadline = time.monotonic() + 10
    while hosts(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hosts(kernel) == []
    trained = kernel.run("""
background = notebook_launcher(train, args=(4,), progress="off", block=False).wait(120)
blocking = notebook_launcher(train, args=(4,), progress="off")
""")
    assert trained.error is None, trained.traceback_text
    assert kernel.value("same_bits(background['state'], blocking['state'])") is True
    assert kernel.value("background['device']") == "xla:0"
    kernel.run("import nbtrain; nbtrain.runs().clear()")  # the runs() registry lets go
