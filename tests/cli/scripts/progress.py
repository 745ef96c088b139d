"""Reports progress and a metric through nbtrain's plain functions (no Accelerator), and the
precision the launcher asked for, as an Accelerator in the rank sees it and uses it."""

import time

import torch

import nbtrain
from nbtrain import Accelerator

acc = Accelerator()
with acc.autocast():
    out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
print(f"precision {acc.mixed_precision} matmul {out.dtype}")
for step in nbtrain.progress(range(20), desc="train"):
    nbtrain.log({"loss": 1.0 / (step + 1)})
    time.sleep(0.02)
