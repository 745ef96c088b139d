"""What the ranks run in the GPU acceptance check (importable by every rank: run.sh puts this
folder on PYTHONPATH). Small, seeded, deterministic trainings whose results the checks compare."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, FullyShardedDataParallelPlugin, set_seed

STEPS = 40


def data(samples: int = 256, width: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(samples, width, generator=generator)
    y = x @ torch.randn(width, 1, generator=generator) + 0.1 * torch.randn(samples, 1,
                                                                           generator=generator)
    return TensorDataset(x, y)


def mlp(width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 1))


def train_mlp(cpu: bool = False, precision: str = "no", accumulate: int = 1,
              batch: int = 32) -> dict[str, Any]:
    """Regression on fixed data; the weights and the last losses come back (on the CPU)."""
    set_seed(0)
    acc = Accelerator(cpu=cpu, mixed_precision=precision, gradient_accumulation_steps=accumulate)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(data(), batch_size=batch, shuffle=False)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    losses: list[float] = []
    for _ in acc.progress(range(STEPS * accumulate // len(loader) + 1), desc="epoch"):
        for x, y in loader:
            with acc.accumulate(model):
                loss = nn.functional.mse_loss(model(x).float(), y)
                acc.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            acc.log({"loss": losses[-1]})
    weights = {k: v.detach().float().cpu() for k, v in acc.unwrap_model(model).state_dict().items()}
    return {"device": str(acc.device), "distributed": acc.distributed_type.value,
            "world": acc.num_processes, "losses": losses, "weights": weights}


def train_mlp_torch_fp16(batch: int = 32) -> dict[str, Any]:
    """train_mlp(precision="fp16") written in plain torch (autocast + GradScaler): the reference
    for fp16, which skips its first steps while the loss scale falls, so it cannot match fp32."""
    set_seed(0)
    model = mlp().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda")
    loader = DataLoader(data(), batch_size=batch, shuffle=False)
    losses: list[float] = []
    for _ in range(STEPS // len(loader) + 1):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x.cuda()).float(), y.cuda())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            losses.append(loss.item())
    weights = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    return {"losses": losses, "weights": weights}


def fp16_skips(steps: int = 6, poison: int = 2) -> dict[str, Any]:
    """fp16 with a grad scaler where step ``poison`` has inf gradients: the Accelerator's
    optimizer must skip that step and lower the scale, exactly as torch's GradScaler does."""
    set_seed(0)
    acc = Accelerator(mixed_precision="fp16")
    model = mlp()
    reference = mlp().to(acc.device)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    scaler = torch.amp.GradScaler("cuda")
    x, y = data().tensors
    x, y = x[:32].to(acc.device), y[:32].to(acc.device)
    ours, torchs = [], []
    for step in range(steps):
        factor = float("inf") if step == poison else 1.0
        with acc.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y) * factor
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ours.append((acc.optimizer_step_was_skipped, float(acc.scaler.get_scale())))
        with torch.autocast("cuda", dtype=torch.float16):
            ref_loss = nn.functional.mse_loss(reference(x).float(), y) * factor
        scaler.scale(ref_loss).backward()
        before = scaler.get_scale()
        scaler.step(ref_optimizer)
        scaler.update()
        ref_optimizer.zero_grad()
        torchs.append((scaler.get_scale() < before, float(scaler.get_scale())))
    ours_now, theirs = acc.unwrap_model(model).state_dict(), reference.state_dict()
    same = all(torch.equal(ours_now[k], theirs[k]) for k in theirs)
    return {"ours": ours, "torch": torchs, "same_weights": same}


def cuda_touch() -> float:
    """The smallest CUDA rank: a tensor on this rank's GPU (cuda:0 when it sees one GPU)."""
    return torch.ones(1, device="cuda").sum().item()


def cuda_touch_raw(index: int) -> None:
    """cuda_touch for torch.multiprocessing.start_processes (which passes the index)."""
    cuda_touch()


def probe() -> dict[str, Any]:
    """Where a rank runs: its CUDA_VISIBLE_DEVICES, device and the card's name."""
    acc = Accelerator()
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(acc.device),
            "count": torch.cuda.device_count(),
            "name": torch.cuda.get_device_name(acc.device) if acc.device.type == "cuda" else ""}


def nccl_all_reduce() -> dict[str, Any]:
    """A NCCL process group in this rank (whatever its world size) and one all_reduce."""
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    group = dist.new_group(backend="nccl") if not made else None  # a gloo world already there
    try:
        t = torch.ones(4, device="cuda") * (dist.get_rank() + 1)
        dist.all_reduce(t, group=group)
        return {"backend": dist.get_backend(group), "world": dist.get_world_size(group),
                "value": t.cpu().tolist()}
    finally:
        if made:
            dist.destroy_process_group()
        elif group is not None:
            dist.destroy_process_group(group)


def train_fsdp(marker: str | None = None, slow: float = 0.0) -> dict[str, Any]:
    """FSDP2 training with dropout, shuffling and Adam: a resume off by one draw differs."""
    torch.use_deterministic_algorithms(True)
    set_seed(0)
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap",
                                            min_num_params=1000)
    acc = Accelerator(fsdp_plugin=plugin, mixed_precision="bf16")
    model = nn.Sequential(mlp(), nn.Dropout(0.1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data(), batch_size=16, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    for _epoch in range(loader.iteration, 4):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x).float(), y)
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if marker and acc.is_main_process and not os.path.exists(marker):
                Path(marker).write_text("training")
            time.sleep(slow)
    state = acc.get_state_dict(model)
    return {k: v.detach().float().cpu() for k, v in state.items()}
