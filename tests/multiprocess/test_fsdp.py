"""FSDP2 through the Accelerator on real gloo ranks: the same training as DDP (weights, loss,
accumulation, clipping, bf16), sharded checkpoints that resume exactly and load into one rank,
full state dicts that load into a plain model, the strategy in the live view."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import torch._dynamo  # (DDP imports it; loading it once here keeps forked ranks fast)
from torch import nn
from torch.nn.functional import mse_loss
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher, set_seed

pytestmark = pytest.mark.timeout(240)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def plugin(**options: Any) -> FullyShardedDataParallelPlugin:
    options.setdefault("auto_wrap_policy", "transformer_based_wrap")
    options.setdefault("transformer_cls_names_to_wrap", ["Block"])
    return FullyShardedDataParallelPlugin(**options)


def loader() -> DataLoader:
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    y = torch.sin(x.sum(1, keepdim=True))
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


def build(fsdp: bool, accumulation: int = 1, precision: str = "no", **options: Any):
    set_seed(0)
    acc = Accelerator(
        fsdp_plugin=plugin(**options) if fsdp else None,
        gradient_accumulation_steps=accumulation,
        mixed_precision=precision,
    )
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer, data = acc.prepare(model, optimizer, loader())
    return acc, model, optimizer, data


def train(
    parts, epochs: int = 2, clip: float | None = None, probe: bool = False, evaluate: bool = False
) -> dict:
    acc, model, optimizer, data = parts
    losses, norms, unsynced_grads = [], [], []
    for _ in range(epochs):
        for x, y in data:
            with acc.accumulate(model):
                loss = mse_loss(model(x), y)
                acc.backward(loss)
                if probe and not acc.sync_gradients:
                    # No reduce-scatter ran: no sharded gradient exists yet.
                    unsynced_grads.append(any(p.grad is not None for p in model.parameters()))
                if clip is not None and acc.sync_gradients:
                    norms.append(float(acc.clip_grad_norm_(model.parameters(), clip)))
                optimizer.step()
                optimizer.zero_grad()
            losses.append(float(acc.reduce(loss.detach(), "mean")))
    evaluated = 0
    if evaluate:
        held_out = DataLoader(TensorDataset(torch.randn(30, 8)), batch_size=4)  # 30 = 7 * 4 + 2
        with torch.no_grad():
            evaluated = sum(len(acc.gather_for_metrics(model(x))) for (x,) in acc.prepare(held_out))
    return {
        "evaluated": evaluated,
        "losses": losses,
        "norms": norms,
        "unsynced_grads": unsynced_grads,
        "weights": acc.get_state_dict(model),  # every rank calls it; full on rank 0
        "type": acc.distributed_type.value,
        "is_fsdp2": acc.is_fsdp2,
    }


def compare(options: dict, accumulation: int = 1, precision: str = "no", clip=None) -> tuple:
    ddp = train(build(False, accumulation, precision), clip=clip, evaluate=True)
    fsdp = train(
        build(True, accumulation, precision, **options), clip=clip, probe=True, evaluate=True
    )
    return ddp, fsdp


def assert_same_training(ddp: dict, fsdp: dict, atol: float = 1e-5) -> None:
    assert ddp["type"] == "MULTI_CPU" and fsdp["type"] == "FSDP" and fsdp["is_fsdp2"]
    assert fsdp["evaluated"] == ddp["evaluated"] == 30  # gather_for_metrics drops the padding
    torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=0, atol=atol)
    assert fsdp["weights"].keys() == ddp["weights"].keys()
    for key, value in ddp["weights"].items():
        torch.testing.assert_close(fsdp["weights"][key], value, rtol=1e-4, atol=atol)


def launch(function, *args: Any, processes: int = 2) -> Any:
    return notebook_launcher(function, args, num_processes=processes, start_method="fork", **QUIET)


def test_fsdp_trains_like_ddp_with_accumulation_and_clipping():
    # Accumulation over 2 micro-steps and clipping at a norm every step exceeds.
    ddp, fsdp = launch(compare, {"reshard_after_forward": True}, 2, "no", 0.05)
    assert len(fsdp["losses"]) == 16
    assert_same_training(ddp, fsdp)
    assert len(fsdp["norms"]) == 8 and all(n > 0.05 for n in fsdp["norms"])
    torch.testing.assert_close(fsdp["norms"], ddp["norms"], rtol=1e-4, atol=1e-6)
    assert fsdp["unsynced_grads"] == [False] * 8  # non-final micro-steps: no reduce-scatter


def test_fsdp_size_based_wrap_without_resharding_with_checkpointing_matches_ddp():
    ddp, fsdp = launch(
        compare,
        {
            "auto_wrap_policy": "size_based_wrap",
            "min_num_params": 200,
            "reshard_after_forward": False,
            "activation_checkpointing": True,  # recomputed activations: the same gradients
        },
    )
    assert_same_training(ddp, fsdp)


def test_fsdp_fp16_scaler_skips_and_clips_like_ddp():
    ddp, fsdp = launch(compare, {}, 2, "fp16", 0.05)
    assert_same_training(ddp, fsdp)
    assert fsdp["norms"][0] == ddp["norms"][0] == float("inf")  # the first scale overflows
    torch.testing.assert_close(fsdp["norms"][1:], ddp["norms"][1:], rtol=1e-4, atol=1e-6)


def test_fsdp_bf16_autocast_and_policy_stay_close_to_ddp():
    ddp, fsdp = launch(compare, {}, 1, "bf16")
    assert_same_training(ddp, fsdp, atol=2e-2)  # bf16 rounds differently in the two layouts
    _, policy = launch(compare, {"mixed_precision_policy": "bf16"})
    assert all(v.dtype == torch.float32 for v in policy["weights"].values())  # fp32 master
    diffs = [abs(a - b) for a, b in zip(policy["losses"], ddp["losses"], strict=True)]
    assert max(diffs) < 0.05, diffs
    first, last = policy["losses"][:4], policy["losses"][-4:]
    assert sum(last) < sum(first), policy["losses"]  # it trains (single batches are noisy)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def save_resume(directory: str, kind: str) -> tuple[dict, dict]:
    whole = build(True, state_dict_type=kind)
    train(whole, epochs=1)
    whole[0].save_state(directory)
    whole[0].save_state(directory)  # again, over the first (in place: a user file is there)
    uninterrupted = train(whole, epochs=1)
    set_seed(123)
    resumed_parts = build(True, state_dict_type=kind)  # same init: reset the weights first
    with torch.no_grad():
        for p in resumed_parts[1].parameters():
            p.zero_()
    resumed_parts[0].load_state(directory)
    resumed = train(resumed_parts, epochs=1)
    return uninterrupted, resumed


@pytest.mark.parametrize("kind", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_save_load_continue_equals_uninterrupted_run(tmp_path, kind):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "tokenizer.json").write_text("{}")
    uninterrupted, resumed = launch(save_resume, str(tmp_path / "ck"), kind)
    assert resumed["losses"] == uninterrupted["losses"]
    for key, value in uninterrupted["weights"].items():
        assert torch.equal(resumed["weights"][key], value), key
    entries = sorted(p.name for p in (tmp_path / "ck").iterdir())
    meta = json.loads((tmp_path / "ck" / "nbtrain_checkpoint.json").read_text())
    if kind == "SHARDED_STATE_DICT":
        assert {"pytorch_model_fsdp_0", "optimizer_0"} <= set(entries)
        assert (tmp_path / "ck" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    else:
        assert {"pytorch_model_fsdp_0.safetensors", "optimizer_0.bin"} <= set(entries)
    assert meta["fsdp"]["state_dict_type"] == kind and meta["world_size"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert ".nbtrain-partial" not in entries and "tokenizer.json" in entries


def save_after_training(directory: str) -> dict:
    parts = build(True)
    result = train(parts, epochs=1)
    parts[0].save_state(directory)
    parts[0].save_model(parts[1], directory + "-model")
    return result


def load_on_one_rank(directory: str) -> dict:
    acc, model, optimizer, _ = build(True)
    with pytest.warns(UserWarning, match="resharded"):
        acc.load_state(directory)
    return {
        "weights": acc.get_state_dict(model),
        "adam": {k: v["exp_avg"].clone() for k, v in optimizer.state_dict()["state"].items()},
        "type": acc.distributed_type.value,
    }


def test_two_rank_sharded_checkpoint_loads_into_one_rank_and_a_plain_model(tmp_path):
    from safetensors.torch import load_file

    directory = str(tmp_path / "ck")
    trained = launch(save_after_training, directory)
    one = launch(load_on_one_rank, directory, processes=1)
    assert one["type"] == "FSDP" and len(one["adam"]) == len(trained["weights"])
    for key, value in trained["weights"].items():
        assert torch.equal(one["weights"][key], value), key
    # save_model: a full safetensors file that loads into the plain model.
    plain = Net()
    plain.load_state_dict(load_file(str(tmp_path / "ck-model" / "model.safetensors")))
    for key, value in plain.state_dict().items():
        assert torch.equal(value, trained["weights"][key])
    # The returned state dict (acc.get_state_dict) is whole and on the CPU in the kernel.
    weights = trained["weights"].values()
    assert all(v.device.type == "cpu" and v.dtype == torch.float32 for v in weights)


# ---------------------------------------------------------------------------------------------
# The live view


def prepare_only() -> str:
    return type(build(True)[1]).__name__


def test_live_view_rows_show_the_strategy(monkeypatch):
    from nbtrain.display.runstate import RunState

    states: list[RunState] = []
    original = RunState.apply

    def apply(self: RunState, event: Any) -> None:
        if self not in states:
            states.append(self)
        original(self, event)

    monkeypatch.setattr(RunState, "apply", apply)
    assert launch(prepare_only) == "FSDPNet"  # fully_shard changed the user's module in place
    (state,) = states
    assert [view.strategy for view in state.ranks.values()] == ["fsdp2", "fsdp2"]


# ---------------------------------------------------------------------------------------------
# Hugging Face Trainer: it makes Accelerate's own Accelerator, not nbtrain's


def trainer_with_fsdp(output_dir: str) -> tuple[str, str, bool]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    ids = torch.randint(0, 64, (16, 16))
    args = TrainingArguments(
        output_dir,
        fsdp="full_shard",
        fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]},
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        save_strategy="no",
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=[{"input_ids": row, "labels": row} for row in ids],
    )
    trainer.train()
    state = trainer.accelerator.state
    return (
        state.distributed_type.value,
        type(trainer.model_wrapped).__name__,
        getattr(state, "fsdp_plugin", None) is not None,
    )


def test_trainer_fsdp_on_cpu_ranks_trains_unsharded_as_the_readme_says(tmp_path):
    # Accelerate 1.15 turns its FSDP plugin on for accelerator devices only (MULTI_GPU, ...;
    # not MULTI_CPU), so on CPU ranks the Trainer trains with DDP. If this starts failing,
    # Accelerate changed: update notebooks/guides/fsdp.md.
    pytest.importorskip("transformers")
    result = launch(trainer_with_fsdp, str(tmp_path / "out"))
    assert result == ("MULTI_CPU", "DistributedDataParallel", False)


# ---------------------------------------------------------------------------------------------
# cpu_ram_efficient_loading: only rank 0 builds real weights


def meta_on_other_ranks() -> dict:
    acc = Accelerator(fsdp_plugin=plugin(cpu_ram_efficient_loading=True))
    torch.manual_seed(7)
    if acc.is_main_process:
        model = Net()
        expected = {k: v.clone() for k, v in model.state_dict().items()}
    else:
        with torch.device("meta"):
            model = Net()
        expected = {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    weights = acc.get_state_dict(model)
    loss = model(torch.ones(2, 8)).sum()  # every rank computes with rank 0's weights
    return {"expected": expected, "weights": weights, "loss": float(acc.gather(loss[None]).std())}


def test_cpu_ram_efficient_loading_broadcasts_rank0_weights_into_meta_ranks():
    result = launch(meta_on_other_ranks)
    assert result["loss"] == 0.0  # the same output on both ranks
    for key, value in result["expected"].items():
        assert torch.equal(result["weights"][key], value), key


def prepare_a_stepped_optimizer() -> str:
    acc = Accelerator(fsdp_plugin=plugin())
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(1, 8)).sum().backward()
    optimizer.step()  # its moments belong to the full parameters
    try:
        acc.prepare(model, optimizer)
    except ValueError as error:
        return str(error)
    return "prepared"


def test_an_optimizer_that_stepped_before_prepare_is_refused():
    assert "already has state" in launch(prepare_a_stepped_optimizer)
