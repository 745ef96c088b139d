"""Checks in a real Jupyter kernel, as a notebook user meets them: a kernel that touched CUDA
first (fork refused with the line named, auto's clean start, training on cuda:0, the live view's
GPU), and warm ranks holding CUDA state across cells."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_report import Results
from kernelutil import Kernel

SETUP = """\
import os, torch, nbtrain
from nbtrain import notebook_launcher, WorkerError
from gpu_workloads import train_mlp, cuda_touch, probe, nccl_all_reduce
"""
TOUCH = 'x = torch.zeros(1, device="cuda")'  # cell In[2], line 1


def check_env(results: Results) -> None:
    done = subprocess.run([sys.executable, "-m", "nbtrain.kernel.cli.commands", "env"],
                          capture_output=True, text=True, timeout=120)
    gpus = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("GPU ")]
    counted = next((line.strip() for line in done.stdout.splitlines() if "CUDA GPUs" in line), "")
    print(done.stdout, flush=True)
    results.add("1. nbtrain env", done.returncode == 0 and bool(gpus),
                f"{counted}; {'; '.join(gpus)}" if gpus else counted or "no output",
                done.stderr[-500:])


def check_kernel(results: Results, gpus: int) -> None:
    with tempfile.TemporaryDirectory() as spec_dir:
        kernel = Kernel(Path(spec_dir))
        try:
            _cuda_first(kernel, results, gpus)
            _warm_ranks(kernel, results, gpus)
        finally:
            kernel.shutdown()


def _run(kernel: Kernel, code: str, timeout: float = 180) -> tuple[str, str]:
    """stdout (+ error text) and every display's JSON, of one cell."""
    out = kernel.run(code, timeout=timeout)
    text = out.stdout + out.stderr + (out.traceback_text if out.error else "")
    return text, json.dumps(out.displays)


def _cuda_first(kernel: Kernel, results: Results, gpus: int) -> None:
    _run(kernel, SETUP)
    _run(kernel, TOUCH)
    with results.guard("2. fork refused after CUDA in the kernel"):
        text, _ = _run(kernel, (
            "try:\n    notebook_launcher(cuda_touch, num_processes=2, start_method='fork')\n"
            "except ValueError as e:\n    print('REFUSED', e)\n"))
        named = "Cell In[2], line 1" in text
        results.add("2. fork refused after CUDA in the kernel",
                    "REFUSED" in text and "forkserver" in text and named,
                    "ValueError names forkserver" + (" and Cell In[2], line 1" if named else
                                                     ", but not the line that used CUDA"),
                    text[-600:])
    with results.guard("2. auto: clean start, says why"):
        started = time.perf_counter()
        text, shown = _run(kernel, "print('VALUE', notebook_launcher(cuda_touch, num_processes=2))")
        seconds = time.perf_counter() - started
        why = "not fork: CUDA was initialised by Cell In[2], line 1" in shown
        results.add("2. auto: clean start, says why", "VALUE 1.0" in text and "forkserver" in shown
                    and why, f"2 CUDA ranks by forkserver in {seconds:.1f} s; title "
                    + ("names the cell" if why else "does not say why"), text[-600:])
    with results.guard("2. trains on cuda:0, weights back on the CPU"):
        text, shown = _run(kernel, (
            f"r = notebook_launcher(train_mlp, num_processes={gpus})\n"
            "print('DEVICE', r['device'], r['distributed'], "
            "{v.device.type for v in r['weights'].values()}, round(r['losses'][-1], 4))"))
        results.add("2. trains on cuda:0, weights back on the CPU",
                    "DEVICE cuda:0" in text and "{'cpu'}" in text,
                    text.split("DEVICE", 1)[-1].strip()[:120], text[-600:])
        name = _card_name()
        results.add("7. live view shows the GPU in the rank's row",
                    bool(name) and name in shown and "GiB" in shown,
                    f"row status names {name!r} and its memory" if name in shown else
                    "GPU not in the row", shown[-600:])


def _warm_ranks(kernel: Kernel, results: Results, gpus: int) -> None:
    with results.guard("4. warm ranks on CUDA"):
        _run(kernel, "ranks = nbtrain.start_ranks(1)")
        _run(kernel, (
            "%%ranks\nimport os, torch\nfrom gpu_workloads import mlp, data\n"
            "from nbtrain import Accelerator\nacc = Accelerator()\n"
            "model = mlp().to(acc.device)\nopt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
            "model, opt = acc.prepare(model, opt)\n"
            "x, y = (t.to(acc.device) for t in data().tensors)\nsteps = 0\n"))
        step = ("    loss = torch.nn.functional.mse_loss(model(x), y)\n    acc.backward(loss)\n"
                "    opt.step(); opt.zero_grad(); steps += 1\n")
        text, _ = _run(kernel, f"%%ranks\nfor _ in range(50):\n{step}print('TRAINED', steps)")
        trained = "TRAINED 50" in text
        text, _ = _run(kernel, ("w = ranks.pull('acc.unwrap_model(model)[0].weight')\n"
                                "print('PULLED', w[0].device, tuple(w[0].shape))"))
        pulled = "PULLED cpu" in text
        msg = kernel.start(f"%%ranks\nprint('looping', flush=True)\nwhile True:\n{step}")
        kernel.collect(msg, timeout=120, until="looping")
        time.sleep(1.0)
        kernel.manager.interrupt_kernel()
        kernel.collect(msg, timeout=60)
        text, _ = _run(kernel, "%%ranks\nprint('KEPT', steps > 50, x.device)")
        kept = "KEPT True cuda:0" in text
        results.add("4. warm ranks on CUDA", trained and pulled and kept,
                    f"prepared cell -> trained next cell: {trained}; pull on CPU: {pulled}; "
                    f"state kept after interrupt in a CUDA loop: {kept}", text[-600:])
    with results.guard("3. NCCL in a rank process"):
        text, _ = _run(kernel, "print('NCCL', ranks.run(nccl_all_reduce))")
        results.add("3. NCCL in a rank process", "'backend': 'nccl'" in text,
                    text.split("NCCL", 1)[-1].strip()[:120], text[-600:])
    with results.guard("4. ranks.stop() frees the GPU"):
        text, _ = _run(kernel, "pid = ranks.pull('os.getpid()')[0]\nprint('PID', pid)")
        pid = int(text.split("PID", 1)[1].split()[0])
        before, used_before = _gpu_pids(), _used_mib()
        _run(kernel, "ranks.stop()")
        deadline = time.monotonic() + 15
        while pid in _gpu_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        drop = used_before - _used_mib()
        if pid in before:  # nvidia-smi sees this machine's pids
            freed = pid not in _gpu_pids()
            figure = f"rank pid {pid} held {before[pid]} MiB; after stop: " + (
                "gone from nvidia-smi" if freed else "still listed")
        else:  # pids hidden (a container): the card's memory in use must drop
            freed = drop > 200
            figure = f"pids not shown by nvidia-smi; memory in use fell by {drop} MiB"
        results.add("4. ranks.stop() frees the GPU", freed, figure, f"before={before}")
    with results.guard("3. gpu_ids / CUDA_VISIBLE_DEVICES"):
        last = gpus - 1
        text, _ = _run(kernel, (f"with nbtrain.start_ranks(1, gpu_ids=[{last}]) as r:\n"
                                "    print('PROBE', r.run(probe))"))
        ok = f"'visible': '{last}'" in text and "'device': 'cuda:0'" in text
        results.add("3. gpu_ids / CUDA_VISIBLE_DEVICES", ok,
                    f"gpu_ids=[{last}] -> " + text.split("PROBE", 1)[-1].strip()[:140],
                    text[-600:])


def _card_name() -> str:
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30)
    return done.stdout.splitlines()[0].strip() if done.stdout.strip() else ""


def _used_mib() -> int:
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    return sum(int(line) for line in done.stdout.split() if line.strip().isdigit())


def _gpu_pids() -> dict[int, int]:
    """Processes holding GPU memory, by nvidia-smi: pid -> MiB."""
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=30)
    held = {}
    for line in done.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            held[int(parts[0])] = int(parts[1]) if parts[1].isdigit() else 0
    return held
