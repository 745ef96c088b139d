"""FullyShardedDataParallelPlugin: Accelerate's names checked for FSDP2 when the plugin is made,
the FSDP_* / ACCELERATE_USE_FSDP variables of ``accelerate launch``, the wrap policies' choice of
layers, the XLA refusal, and the strategy label of a rank's row."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nbtrain import Accelerator, DistributedType, FullyShardedDataParallelPlugin
from nbtrain.accelerator.fsdp.setup import plugin_for
from nbtrain.accelerator.fsdp.strategy import _layers_to_shard
from nbtrain.display.formatting import format_rank
from nbtrain.display.rows import label_html
from nbtrain.display.runstate import RankView


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"fsdp_version": 1}, ValueError, r"fsdp_version=1.*FSDP2.*fsdp_version=2"),
        ({"sharding_strategy": "HYBRID_SHARD"}, ValueError, r"HYBRID_SHARD.*2-D device mesh"),
        ({"sharding_strategy": "NO_SHARD"}, ValueError, r"NO_SHARD is plain DDP"),
        (
            {"sharding_strategy": "FULL_SHARD", "reshard_after_forward": False},
            ValueError,
            "disagree",
        ),
        ({"backward_prefetch": "BACKWARD_POST"}, ValueError, r"backward_prefetch=.*prefetches"),
        ({"cpu_offload": True}, ValueError, r"cpu_offload=True.*Drop cpu_offload="),
        ({"use_orig_params": False}, ValueError, "original parameters"),
        ({"forward_prefetch": True}, ValueError, "forward prefetch"),
        ({"ignored_modules": [nn.Linear(1, 1)]}, ValueError, "ignored_modules"),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, ValueError, "no LOCAL_STATE_DICT"),
        ({"auto_wrap_policy": "layer_wrap"}, ValueError, "'transformer_based_wrap'"),
        ({"auto_wrap_policy": "size_based_wrap", "min_num_params": 0}, ValueError, "at least 1"),
        ({"min_num_params": "5"}, TypeError, "whole number"),
        ({"reshard_after_forward": "sometimes"}, ValueError, "True"),
        ({"cpu_ram_efficient_loading": "yes"}, TypeError, "True or False"),
        ({"mixed_precision_policy": "fp8"}, ValueError, "fp8 is not supported"),
        ({"mixed_precision_policy": {"buffer_dtype": "bf16"}}, ValueError, "buffer_dtype"),
        ({"mixed_precision_policy": {"param_dtype": "half-ish"}}, ValueError, "not a dtype"),
    ],
)
def test_options_fsdp2_cannot_honour_are_refused_when_the_plugin_is_made(options, error, match):
    with pytest.raises(error, match=match):
        FullyShardedDataParallelPlugin(**options)


def test_accelerate_spellings_translate_to_fsdp2_settings():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    default = FullyShardedDataParallelPlugin().settings()
    assert default.reshard_after_forward and default.wrap == "no_wrap"
    assert default.sharded_state_dict and default.mp_policy is None
    grad_op = FullyShardedDataParallelPlugin(
        sharding_strategy="SHARD_GRAD_OP",
        state_dict_type="full_state_dict",
        use_orig_params=True,
        mixed_precision_policy={"param_dtype": "bf16", "reduce_dtype": torch.float32},
        transformer_cls_names_to_wrap="Block, Head",
        auto_wrap_policy="transformer_based_wrap",
    ).settings()
    assert not grad_op.reshard_after_forward and not grad_op.sharded_state_dict
    assert grad_op.mp_policy == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    assert grad_op.layer_classes == ("Block", "Head")


def test_accelerate_launch_variables_fill_unset_fields_and_turn_fsdp_on(monkeypatch):
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP")
    monkeypatch.setenv("FSDP_MIN_NUM_PARAMS", "300")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    settings = FullyShardedDataParallelPlugin(min_num_params=500).settings()
    assert settings.wrap == "size_based_wrap" and settings.min_num_params == 500  # argument wins
    assert not settings.reshard_after_forward and not settings.sharded_state_dict
    assert settings.activation_checkpointing
    assert Accelerator(cpu=True).fsdp_plugin is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    acc = Accelerator(cpu=True)
    assert acc.is_fsdp2 and acc.distributed_type == DistributedType.FSDP == "FSDP"
    assert acc.state.fsdp_plugin is acc.fsdp_plugin


def test_xla_is_refused_with_torch_xla_spmd_named():
    with pytest.raises(ValueError, match=r"XLA.*SPMD sharding"):
        plugin_for(FullyShardedDataParallelPlugin(), torch.device("xla"))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 32), Block(32), Block(32), nn.Linear(32, 1))


def test_wrap_policies_choose_layers_innermost_first_never_the_root():
    net = model()
    by_class = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    assert _layers_to_shard(net, by_class.settings()) == [net[1], net[2]]
    # Block has 32*32+32 + 2*32 = 1120 parameters, its Linear 1056: the Linear is taken first,
    # and the Block then only has its LayerNorm's 64 left, below the threshold.
    by_size = FullyShardedDataParallelPlugin(
        auto_wrap_policy="size_based_wrap", min_num_params=1000
    )
    assert _layers_to_shard(net, by_size.settings()) == [net[1].inner, net[2].inner]
    assert _layers_to_shard(net, FullyShardedDataParallelPlugin().settings()) == []
    missing = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Decoder"]
    )
    with pytest.raises(ValueError, match=r"\['Decoder'\].*'Block'"):
        _layers_to_shard(net, missing.settings())


def test_a_rank_row_shows_its_strategy_beside_its_device():
    label = label_html(RankView(rank=0, device="cpu", strategy="fsdp2"))
    assert "<b>rank 0</b> · cpu · fsdp2</span>" in label
    assert 'title="rank 0 · cpu · fsdp2"' in label  # whole on hover when cut
    assert "<b>rank 1</b> · cuda:1</span>" in label_html(RankView(rank=1, device="cuda:1"))
    assert format_rank(RankView(rank=0, strategy="fsdp2")).startswith("[rank 0 · fsdp2] ")
    assert format_rank(RankView(rank=1)).startswith("[rank 1] ")
