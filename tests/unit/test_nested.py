"""Nested batches: flatten/rebuild, and moving to a device (the 'meta' device stands in for a GPU:
it is a real device a CPU-only machine has)."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import torch
from torch.utils.data import DataLoader, TensorDataset

from nbtrain.accelerator.comm import nested
from nbtrain.accelerator.data.loaders import prepare_data_loader
from nbtrain.accelerator.training.accumulation import GradientState
from nbtrain.accelerator.training.precision import outputs_to_float32

Pair = namedtuple("Pair", ["left", "right"])
META = torch.device("meta")


class Encoding(dict):
    """Like Hugging Face's BatchEncoding: a mapping that moves itself."""

    def to(self, device):
        return Encoding({key: value.to(device) for key, value in self.items()})


def test_leaves_and_rebuild_keep_structure_and_types():
    data = {"a": [torch.ones(1), (2, Pair(torch.zeros(1), "x"))], "b": OrderedDict(c=3)}
    flat = nested.leaves(data)
    assert len(flat) == 5
    rebuilt = nested.rebuild(data, [f"leaf{i}" for i in range(5)])
    assert rebuilt == {"a": ["leaf0", ("leaf1", Pair("leaf2", "leaf3"))], "b": {"c": "leaf4"}}
    assert isinstance(rebuilt["a"][1][1], Pair) and isinstance(rebuilt["b"], OrderedDict)


def test_send_to_device_moves_every_tensor():
    batch = {
        "x": torch.ones(2),
        "pair": Pair(torch.zeros(1), [torch.ones(1), "label"]),
        "encoding": Encoding(ids=torch.arange(3)),
    }
    moved = nested.send_to_device(batch, META)
    assert moved["x"].device == META and moved["pair"].left.device == META
    assert moved["pair"].right[0].device == META and moved["pair"].right[1] == "label"
    assert isinstance(moved["encoding"], Encoding) and moved["encoding"]["ids"].device == META


def test_prepared_loader_places_batches_on_its_device():
    loader = DataLoader(TensorDataset(torch.arange(4), torch.ones(4)), batch_size=2)
    prepared = prepare_data_loader(
        loader,
        world_size=1,
        rank=0,
        split_batches=False,
        even_batches=True,
        seed=0,
        device=META,
        gradient_state=GradientState(),
    )
    assert all(x.device == META and y.device == META for x, y in prepared)


def test_model_outputs_become_float32():
    out = outputs_to_float32(
        {"logits": torch.ones(1, dtype=torch.bfloat16), "ids": torch.ones(1, dtype=torch.int64)}
    )
    assert out["logits"].dtype == torch.float32 and out["ids"].dtype == torch.int64
    pair = outputs_to_float32(Pair(torch.ones(1, dtype=torch.float16), [torch.ones(1)]))
    assert isinstance(pair, Pair) and pair.left.dtype == torch.float32
