"""Wide runs: what the kernel side costs at 2 to 1,024 ranks (issue 44).

Everything runs in a real Jupyter kernel (jupyter_client), as a notebook user has it: the live
view is the widget dashboard, and what the frontend receives is counted by the client itself.

1. **Real fork ranks** (N = 2, 8, 32, 64; gloo-free tiny work): each rank runs STEPS steps of
   ``nbtrain.progress`` + ``nbtrain.log`` at 50 steps per second and prints 4 lines. Per N: the
   cell's wall time, the kernel's CPU per second of run (psutil, the kernel process alone), events
   applied per second (``RunState.apply`` calls), messages the frontend got per second (every
   iopub message of the cell except status and execute_input), the kernel's memory (RSS after
   the cell, and its growth over the run), one view update (``WidgetView.draw``: median and max).
2. **Launch round trip** of N fork ranks, empty function: ``notebook_launcher`` (its default view)
   against ``torch.multiprocessing.start_processes(start_method="fork")``, alternated in the
   kernel; **failure -> WorkerError** (rank N-1 raises while the others sleep: from its raise to
   the kernel catching WorkerError); **Ctrl-C -> control back** (the client interrupts a launch
   whose ranks all sleep: until the kernel is idle); a **warm empty ``%%ranks`` cell** on N warm
   ranks (``start_ranks(N, start_method="fork")``: client round trip).
3. **Simulated ranks** (256 and 1,024, no processes): each rank's event stream as its
   ``progress``/``log`` would send it (the rank side's own update interval for that world size,
   ``reporter.update_interval``; Progress + Log updates, 4 output lines), pickled into frames,
   decoded by ``FrameDecoder`` and fed to a real ``Run`` (outcome, RunState, cell output, the
   widget view) with its ``tick`` at the watch loop's rate: everything after the rank pipes. The
   frames' encoding is the ranks' work and is subtracted from the kernel's CPU.
4. ``--ray``: 16 ranks on a local two-node Ray cluster (own free ports, own temp dir), the same
   work as 1.

The machine is shared; the load (``uptime``) is printed beside every table.

    python benchmarks/scale.py [--ranks 2,8,32,64] [--simulated 256,1024] [--rounds 3] [--steps 200]
        [--ray] [--skip view,launch,failure,interrupt,warm]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "kernel"))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

STEPS = 200  # steps per rank: 4 s at 50 steps per second
STEP_TIME = 0.02
SIM_SECONDS = 5.0  # simulated run length
QUIET = ("status", "execute_input")  # iopub messages that are not output
KINDS: dict[str, int] = {}  # output messages by type, of the cells since the last reset

# Installed in the kernel once: counters around the kernel side's own calls, the rank work.
SETUP = r"""
import json, os, statistics, sys, time
import psutil
import nbtrain
from nbtrain.display import runstate as _runstate, widgets as _widgets
sys.path.insert(0, BENCH_DIR)
_me = psutil.Process()
_applied = [0]
_draws = []
_started = {"expected": 0, "count": 0, "at": None}  # the CPU and time once every rank started
from nbtrain.shared.events import Started as _Started
_apply, _draw = _runstate.RunState.apply, _widgets.WidgetView.draw
def _counted_apply(self, event):
    _applied[0] += 1
    if type(event) is _Started:
        _started["count"] += 1
        if _started["count"] == _started["expected"]:
            _started["at"] = (_cpu(), time.perf_counter())
    return _apply(self, event)
def _timed_draw(self, state, **kw):
    began = time.perf_counter()
    try:
        return _draw(self, state, **kw)
    finally:
        _draws.append(time.perf_counter() - began)
_runstate.RunState.apply = _counted_apply
_widgets.WidgetView.draw = _timed_draw

def _cpu():
    times = _me.cpu_times()
    return times.user + times.system

def work(steps=STEPS):
    for i in nbtrain.progress(range(steps), desc="train"):
        nbtrain.log({"loss": 1.0 / (i + 1), "lr": 0.1})
        time.sleep(STEP_TIME)
        if i % 50 == 49:
            print(f"all ranks reached step {i + 1}")

def _measured(n, thunk):
    _applied[0] = 0
    _draws.clear()
    _started.update(expected=n, count=0, at=None)
    rss, cpu, began = _me.memory_info().rss, _cpu(), time.perf_counter()
    thunk()
    wall = time.perf_counter() - began
    steady_cpu, steady_at = _started["at"] or (cpu, began)
    steady = (_cpu() - steady_cpu) / max(1e-9, time.perf_counter() - steady_at)
    draws = sorted(_draws) or [0.0]
    print("RESULT " + json.dumps({
        "wall": wall, "cpu": _cpu() - cpu, "applied": _applied[0], "steady": steady,
        "rss": _me.memory_info().rss, "grew": _me.memory_info().rss - rss,
        "draw_median": statistics.median(draws), "draw_max": draws[-1], "draws": len(_draws),
    }))

def noop():
    return None

def _tmp_noop(index):
    return None

def fail_last(n, path):
    rank = int(os.environ["RANK"])
    if rank == n - 1:
        time.sleep(1.0)  # every rank is up by then
        with open(path, "w") as handle:
            handle.write(repr(time.time()))
        raise ValueError("rank %d failed on purpose" % rank)
    while True:
        time.sleep(0.05)

def sleep_forever(path):
    open(os.path.join(path, os.environ["RANK"]), "w").close()
    while True:
        time.sleep(0.05)
"""

SIMULATE = """
from scale import simulate
_draws.clear()
_applied[0] = 0
_before = _cpu()
_result = simulate({n}, {seconds})
_result["cpu"] = _cpu() - _before - _result.pop("encode_cpu")
_result["rss"] = _me.memory_info().rss
_result["draw_median"] = statistics.median(sorted(_draws) or [0.0])
_result["draw_max"] = max(_draws or [0.0])
_result["applied"] = _applied[0]
print("RESULT " + json.dumps(_result))
"""


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the client's side -----------------------------------------------------------------------


def execute(client, code: str, timeout: float = 600, interrupt_after=None):
    """Run ``code``; return (wall seconds, output messages, stdout, error). ``interrupt_after``:
    a callable polled while the cell runs; once it returns True the kernel is interrupted and
    the wall time is counted from then."""
    began = time.perf_counter()
    msg_id = client.execute(code, store_history=False)
    deadline = time.monotonic() + timeout
    messages, stdout, error, interrupted = 0, "", None, None
    while True:
        if interrupt_after is not None and interrupted is None and interrupt_after():
            interrupted = time.perf_counter()
            interrupt_after.kernel.manager.interrupt_kernel()
        try:
            msg = client.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell still running after {timeout}s: {code[:80]!r}") from None
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind not in QUIET:
            messages += 1
            KINDS[kind] = KINDS.get(kind, 0) + 1
        if kind == "stream" and msg["content"]["name"] == "stdout":
            stdout += msg["content"]["text"]
        if kind == "error":
            error = msg["content"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            wall = time.perf_counter() - (interrupted or began)
            return wall, messages, stdout, error


def result_of(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def checked(outcome, code: str):
    wall, messages, stdout, error = outcome
    if error is not None:
        raise RuntimeError(f"{code[:60]!r} failed: {error['ename']}: {error['evalue']}")
    return wall, messages, stdout


def view_row(label: str, wall: float, messages: int, r: dict) -> str:
    """A row of the table; ``messages``: every output message of the cell, the dashboard's
    widgets opened and closed once per launch included (KINDS tells them apart)."""
    per_s = r.get("wall", wall)
    updates = sum(KINDS.get(kind, 0) for kind in ("comm_msg", "stream", "update_display_data"))
    steady = f"{100 * r['steady']:.1f}%" if "steady" in r else "n/a"
    return (
        f"| {label} | {per_s:.2f} s | {100 * r['cpu'] / per_s:.1f}% | {steady} | "
        f"{r['applied'] / per_s:.0f} | "
        f"{messages / per_s:.1f} ({updates / per_s:.1f}) | "
        f"{r['rss'] / 2**20:.0f} MB (+{r['grew'] / 2**20:.0f}) | "
        f"{1000 * r['draw_median']:.1f} / {1000 * r['draw_max']:.1f} ms |"
    )


VIEW_HEADER = (
    "| ranks | wall | kernel CPU | kernel CPU, all ranks up | events applied/s | "
    "frontend msgs/s (updates/s) "
    "| kernel RSS (growth) | view update median / max |\n|---|---:|---:|---:|---:|---:|---:|---:|"
)


def live_work(kernel, n: int, cluster: str = "") -> str:
    KINDS.clear()
    code = (
        f"_measured({n}, lambda: nbtrain.notebook_launcher(work, num_processes={n}{cluster}))"
    )
    wall, messages, stdout = checked(execute(kernel.client, code), code)
    return view_row(str(n), wall, messages, result_of(stdout)) + f" <!-- {KINDS} -->"


def simulated(kernel, n: int) -> str:
    KINDS.clear()
    code = SIMULATE.format(n=n, seconds=SIM_SECONDS)
    wall, messages, stdout = checked(execute(kernel.client, code), code)
    result = result_of(stdout)
    result["grew"] = result["rss"] - result.pop("rss_before")
    return view_row(f"{n} (simulated)", wall, messages, result)


def launches(kernel, n: int, rounds: int) -> dict[str, list[float]]:
    cases = {
        "nbtrain": f"nbtrain.notebook_launcher(noop, num_processes={n})",
        "torch.multiprocessing": (
            "import torch.multiprocessing as _tmp\n"
            f"_tmp.start_processes(_tmp_noop, nprocs={n}, start_method='fork')"
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for code in cases.values():  # once each, unmeasured: imports, first fork
        checked(execute(kernel.client, code), code)
    for round_ in range(rounds):
        names = list(cases)[round_ % 2 :] + list(cases)[: round_ % 2]
        for name in names:
            timed = (
                f"_t = time.perf_counter()\n{cases[name]}\n"
                "print('RESULT', json.dumps({'t': time.perf_counter() - _t}))"
            )
            _, _, stdout = checked(execute(kernel.client, timed), timed)
            samples[name].append(result_of(stdout)["t"])
    return samples


def failure_delay(kernel, n: int) -> float:
    path = tempfile.mktemp(prefix="nbtrain-scale-fail-")
    code = (
        "try:\n"
        f"    nbtrain.notebook_launcher(fail_last, ({n}, {path!r}), num_processes={n})\n"
        "except nbtrain.WorkerError:\n"
        "    _caught = time.time()\n"
        f"print('RESULT', json.dumps({{'t': _caught - float(open({path!r}).read())}}))"
    )
    _, _, stdout = checked(execute(kernel.client, code), code)
    os.unlink(path)
    return result_of(stdout)["t"]


class _AllStarted:
    """Polled by ``execute``: True once every rank wrote its file (then the client interrupts)."""

    def __init__(self, kernel, folder: str, n: int) -> None:
        self.kernel, self.folder, self.n = kernel, folder, n

    def __call__(self) -> bool:
        return len(os.listdir(self.folder)) >= self.n


def interrupt_delay(kernel, n: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        code = f"nbtrain.notebook_launcher(sleep_forever, ({folder!r},), num_processes={n})"
        started = _AllStarted(kernel, folder, n)
        wall, _, _, error = execute(kernel.client, code, interrupt_after=started)
        assert error is not None and error["ename"] == "KeyboardInterrupt", error
        return wall


def warm_cell(kernel, n: int, cells: int = 20) -> list[float]:
    start = f"_ranks = nbtrain.start_ranks({n}, start_method='fork')"
    checked(execute(kernel.client, start, timeout=600), start)
    try:
        for _ in range(3):
            checked(execute(kernel.client, "%%ranks\npass"), "%%ranks")
        cell = "%%ranks\npass"
        return [checked(execute(kernel.client, cell), cell)[0] for _ in range(cells)]
    finally:
        checked(execute(kernel.client, "_ranks.stop()"), "_ranks.stop()")


# -- the simulated ranks (run inside the kernel) ---------------------------------------------


def simulate(n: int, seconds: float) -> dict:
    """N ranks' event streams for ``seconds`` of wall time through the kernel side's real code.

    Each rank steps at 1/STEP_TIME steps per second, phase-shifted, and sends what its reporter
    would: a Progress and a Log (every step logged since its last update) once per update
    interval, the lines of ``work`` at steps 50, 100, ... Frames go through FrameDecoder into
    ``Run.emit``; ``Run.tick`` runs at the watch loop's rate (supervisor.TICK).
    """
    import psutil

    from nbtrain.kernel.group.supervisor import TICK
    from nbtrain.kernel.options.config import build_config
    from nbtrain.kernel.run.lifecycle import Run
    try:  # (the coalescing's own module since session 7; reporting.py before)
        from nbtrain.rank import reporter as reporting
    except ImportError:
        from nbtrain.rank import reporting  # type: ignore[no-redef]
    from nbtrain.shared.events import (
        Exited,
        Finished,
        FrameDecoder,
        Log,
        Output,
        Progress,
        Started,
        encode,
    )

    interval = _interval(reporting, n)
    config = build_config(
        num_processes=n, start_method="fork", mixed_precision=None, gpu_ids=None, num_nodes=1,
        node_rank=0, rdzv_endpoint=None, max_restarts=0, timeout=None, output="all",
        progress="auto", return_all=False, allow_xla=False,
    )
    me = psutil.Process()
    rss_before = me.memory_info().rss
    total = int(seconds / STEP_TIME)
    decoders = [FrameDecoder() for _ in range(n)]
    encode_cpu = 0.0
    run = Run(config, list(range(n)), title=f"{n} simulated ranks")

    def deliver(rank: int, *events) -> None:
        nonlocal encode_cpu
        began = time.process_time()
        data = b"".join(packet for event in events for packet in encode(event, rank))
        encode_cpu += time.process_time() - began
        for event in decoders[rank].feed(data):
            run.emit(event)

    for rank in range(n):
        deliver(rank, Started(rank, 1000 + rank, "cpu", "sim"))
    began = time.monotonic()
    sent = [0] * n  # the last step each rank reported
    next_due = [began + interval * rank / n for rank in range(n)]
    while True:
        now = time.monotonic()
        if now - began >= seconds:
            break
        for rank in range(n):
            if now < next_due[rank]:
                continue
            next_due[rank] = now + interval
            step = min(total, int((now - began) / STEP_TIME))
            if step <= sent[rank]:
                continue
            points = [(s, {"loss": 1.0 / s, "lr": 0.1}) for s in range(sent[rank] + 1, step + 1)]
            points = _thinned(reporting, points, n)
            events = [Progress(rank, step, total, "train", loop="train")]
            *earlier, (last, values) = points
            events.append(Log(rank, values, last, earlier=tuple(earlier)))
            events += [
                Output(rank, "stdout", f"all ranks reached step {s}")
                for s in range(sent[rank] + 1, step + 1) if s % 50 == 0
            ]
            sent[rank] = step
            deliver(rank, *events)
        run.tick()
        time.sleep(max(0.0, TICK - (time.monotonic() - now)))
    for rank in range(n):
        deliver(rank, Finished(rank, b""), Exited(rank, 0, None, False))
    run.end(run.state.done_summary())
    wall = time.monotonic() - began
    return {"wall": wall, "encode_cpu": encode_cpu, "rss_before": rss_before}


def _interval(reporting, n: int) -> float:
    """The rank side's update interval at this world size (today's code: one for all N)."""
    function = getattr(reporting, "update_interval", None)
    return function(n) if function is not None else reporting.INTERVAL


def _thinned(reporting, points: list, n: int) -> list:
    function = getattr(reporting, "thin_points", None)
    return function(points, n) if function is not None else points


# -- main ----------------------------------------------------------------------------------


def ray_section(kernel, n: int) -> str:
    from common import ray_head_args

    head = ray_head_args()
    setup = f"""
import ray
from ray.cluster_utils import Cluster
_cluster = Cluster()
_cluster.add_node(num_cpus={n // 2}, **{head!r})
_cluster.add_node(num_cpus={n // 2})
_cluster.wait_for_nodes()
ray.init(address=_cluster.address, log_to_driver=False)
"""
    checked(execute(kernel.client, setup, timeout=300), "ray setup")
    try:
        return live_work(kernel, n, ", cluster=nbtrain.RayCluster()")
    finally:
        execute(kernel.client, "ray.shutdown(); _cluster.shutdown()", timeout=120)
        shutil.rmtree(str(head["temp_dir"]), ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,8,32,64")
    parser.add_argument("--simulated", default="256,1024")
    parser.add_argument(
        "--rounds", type=int, default=3, help="launch rounds (and failures) per N"
    )
    parser.add_argument(
        "--steps", type=int, default=STEPS,
        help="steps per rank of the real ranks' run (at 50 a second: 200 is 4 s)",
    )
    parser.add_argument("--ray", action="store_true", help="also 16 ranks on a 2-node Ray cluster")
    parser.add_argument(
        "--skip", default="", help="comma list of: view,launch,failure,interrupt,warm"
    )
    options = parser.parse_args()
    ranks = [int(x) for x in options.ranks.split(",") if x]
    sims = [int(x) for x in options.simulated.split(",") if x]
    skip = set(options.skip.split(","))
    from kernelutil import Kernel

    setup = SETUP.replace("BENCH_DIR", repr(str(HERE))).replace("STEPS", str(options.steps))
    setup = setup.replace("STEP_TIME", str(STEP_TIME))
    with tempfile.TemporaryDirectory() as spec_dir:
        kernel = Kernel(Path(spec_dir))
        try:
            checked(execute(kernel.client, setup), "setup")
            if "view" not in skip:
                print(f"\n## The kernel under a run ({options.steps} steps of progress + log at "
                      f"{1 / STEP_TIME:.0f}/s per rank, 4 lines printed; {load()})\n")
                print(VIEW_HEADER, flush=True)
                for n in ranks:
                    print(live_work(kernel, n), flush=True)
                for n in sims:
                    print(simulated(kernel, n), flush=True)
                if options.ray:
                    print(ray_section(kernel, 16) + " (Ray, 2 nodes)", flush=True)
            for n in ranks:
                print(f"\n## {n} ranks ({load()})\n", flush=True)
                if "launch" not in skip:
                    samples = launches(kernel, n, options.rounds)
                    base = statistics.median(samples["torch.multiprocessing"])
                    for name, values in samples.items():
                        median = statistics.median(values)
                        print(f"- launch round trip, {name}: median {median:.3f} s "
                              f"(min {min(values):.3f}, {len(values)} rounds) = "
                              f"{median / base:.2f}x")
                if "failure" not in skip:
                    delays = [failure_delay(kernel, n) for _ in range(options.rounds)]
                    print(f"- failure -> WorkerError: median {statistics.median(delays):.2f} s "
                          f"(min {min(delays):.2f}, max {max(delays):.2f}, "
                          f"{len(delays)} launches)", flush=True)
                if "interrupt" not in skip:
                    delay = interrupt_delay(kernel, n)
                    print(f"- Ctrl-C -> control back: {delay:.2f} s", flush=True)
                if "warm" not in skip:
                    cells = warm_cell(kernel, n)
                    median = 1000 * statistics.median(cells)
                    print(f"- warm empty %%ranks cell: median {median:.1f} ms "
                          f"(min {1000 * min(cells):.1f}, {len(cells)} cells)", flush=True)
        finally:
            kernel.shutdown()


if __name__ == "__main__":
    main()
