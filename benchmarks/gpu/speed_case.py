"""One case of the GPU speed check, in a process of its own (so each peak of GPU memory is its
own): GPT-2 small built from its config (random weights, 124M parameters), bf16 autocast, AdamW,
batch 8 x 512 tokens. Prints one JSON line: steps/s over the timed blocks, peak memory.

    python speed_case.py raw|nbtrain|accelerate [--steps 20] [--blocks 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH, TOKENS, WARMUP = 8, 512, 10


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 50257, (BATCH, TOKENS))
    return model, optimizer, tokens


def raw_step() -> tuple[object, str]:
    model, optimizer, tokens = build()
    model, tokens = model.cuda(), tokens.cuda()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, "cuda:0"


def accelerator_step(accelerator_class: type) -> tuple[object, str]:
    acc = accelerator_class(mixed_precision="bf16")
    model, optimizer, tokens = build()
    model, optimizer = acc.prepare(model, optimizer)
    tokens = tokens.to(acc.device)

    def step() -> None:
        with acc.autocast():
            loss = model(tokens, labels=tokens).loss
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, str(acc.device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["raw", "nbtrain", "accelerate"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=3)
    options = parser.parse_args()
    if options.case == "raw":
        step, device = raw_step()
    elif options.case == "nbtrain":
        from nbtrain import Accelerator

        step, device = accelerator_step(Accelerator)
    else:
        from accelerate import Accelerator as HFAccelerator

        step, device = accelerator_step(HFAccelerator)
    for _ in range(WARMUP):
        step()  # type: ignore[operator]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rates = []
    for _ in range(options.blocks):
        start = time.perf_counter()
        for _ in range(options.steps):
            step()  # type: ignore[operator]
        torch.cuda.synchronize()
        rates.append(options.steps / (time.perf_counter() - start))
    print(json.dumps({"case": options.case, "device": device,
                      "steps_per_s": statistics.median(rates),
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)


if __name__ == "__main__":
    main()
