"""What the tests that run Transformers' real ``Trainer`` inside ranks share: the smallest data
set and model it trains (16 pairs ``x -> 2x``, one linear layer returning the loss), so the
checks are about the world the Trainer's Accelerate state sees, not about the model.

Used in ranks: module-level classes, imported there by reference (the tests' folder is on the
ranks' ``sys.path`` as on the launching process's)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class Pairs(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x = torch.tensor([float(index)])
        return {"x": x, "labels": 2 * x}


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        out = self.linear(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}
