"""Device, backend and strategy choice, with hardware availability stated explicitly (or mocked
at torch's availability calls): the CUDA/MPS paths a CPU-only machine can still check."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nbtrain.accelerator.devices import choice as devices
from nbtrain.accelerator.devices.choice import Availability, choose_device
from nbtrain.accelerator.training import parallel
from nbtrain.accelerator.training.parallel import DistributedType
from nbtrain.rank import rankenv, runtime
from nbtrain.rank.runtime import RankInfo, Runtime
from nbtrain.shared.events import CallbackSink


def test_cuda_rank_gets_its_local_gpu():
    gpus = Availability(cuda_devices=4)
    assert choose_device(gpus, cpu=False, local_rank=2, world_size=4) == torch.device("cuda", 2)
    assert choose_device(gpus, cpu=True, local_rank=2, world_size=4) == torch.device("cpu")


def test_a_rank_without_a_gpu_of_its_own_is_explained():
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=2 but only 2 CUDA GPU\(s\).*cpu=True"):
        choose_device(Availability(cuda_devices=2), cpu=False, local_rank=2, world_size=3)


def test_mps_serves_a_single_process_only():
    mac = Availability(mps=True)
    assert choose_device(mac, cpu=False, local_rank=0, world_size=1) == torch.device("mps")
    with pytest.warns(RuntimeWarning, match="MPS serves a single process"):
        assert choose_device(mac, cpu=False, local_rank=0, world_size=2) == torch.device("cpu")
    assert choose_device(Availability(), cpu=False, local_rank=0, world_size=1).type == "cpu"


def test_detect_reads_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert devices.detect() == Availability(cuda_devices=3, mps=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.detect() == Availability(cuda_devices=0, mps=True)


def test_backend_and_distributed_type_follow_the_device():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert devices.process_group_backend(cuda, nccl_available=True) == "nccl"
    assert devices.process_group_backend(cuda, nccl_available=False) == "gloo"
    assert devices.process_group_backend(cpu, nccl_available=True) == "gloo"
    assert parallel.distributed_type_for(cuda, 2) is DistributedType.MULTI_GPU
    assert parallel.distributed_type_for(cpu, 2) is DistributedType.MULTI_CPU
    assert parallel.distributed_type_for(cuda, 1) is DistributedType.NO
    assert DistributedType.MULTI_GPU == "MULTI_GPU"  # str Enum, as Accelerate's


def test_strategies_are_chosen_by_enum_and_xla_is_a_clean_gap():
    expected = "nbtrain.accelerator.training.parallel:DataParallel"
    assert parallel.STRATEGIES[DistributedType.MULTI_GPU] == expected
    single = parallel.create(DistributedType.NO, torch.device("cpu"), backend="gloo", timeout=5)
    assert single.distributed_type is DistributedType.NO
    assert single.collectives.world_size == 1
    # The XLA strategy (accelerator/devices/xla.py) fills the seam; without torch_xla it says so.
    assert parallel.STRATEGIES[DistributedType.XLA] == "nbtrain.accelerator.devices.xla:XlaStrategy"
    if importlib.util.find_spec("torch_xla") is None:
        with pytest.raises(ImportError, match=r"DistributedType\.XLA needs torch_xla"):
            parallel.create(DistributedType.XLA, torch.device("cpu"), backend="gloo", timeout=5)


def test_cpu_flag_wins_over_visible_gpus(monkeypatch):
    from nbtrain import Accelerator

    monkeypatch.setattr(devices, "detect", lambda: Availability(cuda_devices=2))
    acc = Accelerator(cpu=True)
    assert acc.device == torch.device("cpu") and acc.distributed_type is DistributedType.NO
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert Accelerator().device == torch.device("cpu")


def test_placement_sources(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert rankenv.placement() == rankenv.Placement()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert rankenv.placement() == rankenv.Placement(3, 1, 4, 2)
    info = RankInfo(rank=1, local_rank=1, world_size=2, local_world_size=2)
    with runtime.activate(Runtime(info, CallbackSink(lambda e: None), "bf16")):
        assert rankenv.placement() == rankenv.Placement(1, 1, 2, 2)
        assert rankenv.default_mixed_precision()[0] == "bf16"
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        rankenv.placement()


def test_mixed_precision_default_outside_launches(monkeypatch):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    assert rankenv.default_mixed_precision()[0] is None
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    value, source = rankenv.default_mixed_precision()
    assert value == "bf16" and "ACCELERATE_MIXED_PRECISION" in source


def test_bf16_needs_a_gpu_that_supports_it(monkeypatch):
    from nbtrain.accelerator.training.precision import Precision
    from nbtrain.kernel.options.config import MixedPrecision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    with pytest.raises(ValueError, match=r"bfloat16 support.*mixed_precision='fp16'"):
        Precision(MixedPrecision.BF16, torch.device("cuda", 0))
    cpu = Precision(MixedPrecision.BF16, torch.device("cpu"))  # the CPU has bf16 autocast
    assert cpu.scaler is None and cpu.dtype is torch.bfloat16
