"""Rank-side code of the crash-safe checkpoint tests.

Every save writes one *generation* g: all model parameters and SGD momentum buffers equal to g,
a registered Tag holding g, and each rank's torch RNG seeded from (g, rank). After a load, every
piece must tell the same generation: a checkpoint that mixes two saves, or a partial one taken
for complete, shows as a mismatch.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import threading
import time
from pathlib import Path

from rankfaults import Tag


def rng_seed(generation: int, rank: int) -> int:
    return generation * 100 + rank


def expected_draw(generation: int, rank: int) -> float:
    import torch

    return torch.rand(1, generator=torch.Generator().manual_seed(rng_seed(generation, rank))).item()


def _build():
    import torch

    from nbtrain import Accelerator

    acc = Accelerator()
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))  # 16 MB
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = acc.prepare(model, optimizer)
    tag = Tag(-1)
    acc.register_for_checkpointing(tag)
    return acc, model, optimizer, tag


def _set_generation(acc, model, optimizer, tag, generation: int) -> None:
    import torch

    params = list(acc.unwrap_model(model).parameters())
    for p in params:
        p.grad = torch.full_like(p, float(generation))
    optimizer.step()  # creates the momentum buffers (if a load did not bring them)
    with torch.no_grad():
        for p in params:
            p.fill_(float(generation))
            optimizer.state[p]["momentum_buffer"].fill_(float(generation))
    tag.value = generation
    torch.manual_seed(rng_seed(generation, acc.process_index))


def _read_generation(acc, model, optimizer, tag) -> dict:
    """Which generation each piece holds (None where the pieces disagree among themselves)."""
    import torch

    params = list(acc.unwrap_model(model).parameters())
    values = {float(v) for p in params for v in p.detach().unique()}
    momentum: set = set()
    state = optimizer.state_dict()["state"]
    for index in range(len(params)):
        buffer = state.get(index, {}).get("momentum_buffer")
        momentum |= {float(v) for v in buffer.unique()} if buffer is not None else {None}
    params_gen = values.pop() if len(values) == 1 else None
    momentum_gen = momentum.pop() if len(momentum) == 1 else None
    draw = torch.rand(1).item()
    tag_gen = tag.value
    rng_ok = tag_gen is not None and abs(draw - expected_draw(tag_gen, acc.process_index)) < 1e-9
    return {
        "params": params_gen, "momentum": momentum_gen, "tag": tag_gen, "rng_matches_tag": rng_ok,
    }


def trial(report: str, load_dir: str | None, save_dir: str | None, generation: int,
          victim: int, delay: float) -> str:
    """Load (and report what came back), then save ``generation`` while the victim rank is
    SIGKILLed ``delay`` seconds into the save."""
    acc, model, optimizer, tag = _build()
    rank = acc.process_index
    outcome: dict = {"rank": rank}
    if load_dir is not None:
        try:
            outcome["source"] = acc.load_state(load_dir)
            outcome.update(_read_generation(acc, model, optimizer, tag))
        except FileNotFoundError as exc:
            outcome["refused"] = str(exc)
    Path(f"{report}.{rank}").write_text(json.dumps(outcome))
    acc.wait_for_everyone()  # every report is written before anyone can be killed
    if save_dir is None:
        return "loaded"
    _set_generation(acc, model, optimizer, tag, generation)
    if rank == victim:
        started = time.monotonic()
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
    saved_at = time.monotonic()
    acc.save_state(save_dir)
    Path(f"{report}.returned.{rank}").write_text("")  # a victim without one died mid-save
    if rank == 0:
        Path(f"{report}.saved").write_text(repr(time.monotonic() - saved_at))
    if rank == victim:
        time.sleep(max(0.0, delay - (time.monotonic() - started)) + 5)  # the kill still comes
    return "saved"


def calibrate(save_dir: str) -> float:
    """Seconds one save takes here (rank 0's view)."""
    acc, model, optimizer, tag = _build()
    _set_generation(acc, model, optimizer, tag, 0)
    start = time.monotonic()
    acc.save_state(save_dir)
    return time.monotonic() - start


def kill_after_rename(save_dir: str, generation: int, nth: int) -> None:
    """Save ``generation``; rank 0 is SIGKILLed right after its ``nth`` directory rename (the
    write-aside-then-rename design: 1 = old checkpoint moved aside, 2 = new one in place)."""
    acc, model, optimizer, tag = _build()
    _set_generation(acc, model, optimizer, tag, generation)
    if acc.process_index == 0:
        original = pathlib.Path.rename
        count = [0]

        def rename_then_die(self, target):
            result = original(self, target)
            if pathlib.Path(target).is_dir():
                count[0] += 1
                if count[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)
            return result

        pathlib.Path.rename = rename_then_die  # type: ignore[method-assign]
    acc.save_state(save_dir)
    time.sleep(30)  # rank 0 dies above; rank 1 is stopped by the launcher
