"""Warm ranks on torch_xla's CPU backend (PJRT_DEVICE=CPU, as CI tests TPU): one ordinal.

A warm rank that imports torch_xla in a cell gets the XLA device from its Accelerator, and keeps
the prepared model and optimizer on it across cells. Several ordinals per session need torch_xla's
host process to serve commands (notebooks/guides/warm-ranks.md, TPU).
"""

from __future__ import annotations

import pytest
import torch

import nbtrain

pytestmark = pytest.mark.timeout(300)


def test_one_xla_ordinal_keeps_its_prepared_model_across_cells():
    with nbtrain.start_ranks(1, progress="off", output="none") as ranks:
        values = ranks.run_cell(
            "import torch, torch_xla\nfrom nbtrain import Accelerator\nacc = Accelerator()\n"
            "str(acc.device), acc.distributed_type.value"
        )
        assert values == {0: {"text/plain": "('xla:0', 'XLA')"}}
        ranks.run_cell(
            "torch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, opt = acc.prepare(model, opt)\nx = torch.ones(8, 4, device=acc.device)\n"
            "before = model.weight.detach().cpu().clone()"
        )
        ranks.run_cell(
            "for _ in range(3):\n"
            "    opt.zero_grad(); acc.backward(model(x).pow(2).mean()); opt.step()"
        )
        before, after = ranks.pull("before")[0], ranks.pull("model.weight")[0]
        assert after.device.type == "cpu"  # pulled values arrive on the CPU
        assert not torch.equal(before, after)  # the steps of the third cell trained the model
