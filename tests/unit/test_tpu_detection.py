"""TPU / XLA detection for each hosting environment, with the environment faked: explicit
environment mappings and a fake device-file root (never the launcher mocked). Runs in the main
venv: nothing here imports torch_xla."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from nbtrain import tpu
from nbtrain.config import build_config

COLAB = {"COLAB_RELEASE_TAG": "release-colab_20250101", "COLAB_GPU": "0"}
KAGGLE = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"}
TPU_VM = {"TPU_ACCELERATOR_TYPE": "v3-8", "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "1"}


def device_root(tmp_path: Path, *names: str) -> Path:
    for name in names:
        path = tmp_path / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    (tmp_path / "dev").mkdir(exist_ok=True)
    return tmp_path


def test_plain_machine_is_not_a_tpu(tmp_path):
    target = tpu.detect({"HOME": "/root"}, device_root(tmp_path))
    assert target.host is tpu.Host.NONE and not target.xla and not target.tpu


def test_colab_tpu_vm(tmp_path):
    root = device_root(tmp_path, "accel0", "accel1", "accel2", "accel3")
    target = tpu.detect({**COLAB, "TPU_ACCELERATOR_TYPE": "v2-8"}, root)
    assert (target.host, target.device) == (tpu.Host.COLAB, "TPU")
    assert tpu.default_ordinals(target, {"TPU_ACCELERATOR_TYPE": "v2-8"}, root) == 8


def test_colab_legacy_tpu_node_without_device_files(tmp_path):
    env = {"COLAB_TPU_ADDR": "10.0.0.2:8470", "COLAB_GPU": "0"}
    target = tpu.detect(env, device_root(tmp_path))
    assert target.host is tpu.Host.COLAB and target.tpu
    assert "COLAB_TPU_ADDR" in target.reason


def test_kaggle_tpu_vm_without_tpu_name(tmp_path):
    # Kaggle's TPU VMs set no TPU_NAME (acc #2893), but TPU_WORKER_ID and the chip bounds.
    env = {**KAGGLE, "TPU_WORKER_ID": "0", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1"}
    target = tpu.detect(env, device_root(tmp_path, "accel0", "accel1", "accel2", "accel3"))
    assert (target.host, target.device) == (tpu.Host.KAGGLE, "TPU")
    assert tpu.default_ordinals(target, env, tmp_path) == 8  # 4 chips x 2 cores (v3-8)


def test_cloud_tpu_vm_from_device_files_alone(tmp_path):
    root = device_root(tmp_path, "accel0", "accel1", "accel2", "accel3")
    target = tpu.detect({}, root)
    assert (target.host, target.device) == (tpu.Host.TPU_VM, "TPU")
    assert "/dev/accel0" in target.reason


def test_v5e_vfio_devices(tmp_path):
    root = device_root(tmp_path, "vfio/vfio", "vfio/0", "vfio/1", "vfio/2", "vfio/3")
    target = tpu.detect({}, root)
    assert target.tpu
    assert len(tpu.tpu_device_files(root)) == 4  # the /dev/vfio/vfio control device is no chip
    assert tpu.default_ordinals(target, {}, root) == 4


@pytest.mark.parametrize(
    ("accelerator", "ordinals"),
    [("v2-8", 8), ("v3-8", 8), ("v4-8", 4), ("v5litepod-4", 4), ("v5litepod-16", 8)],
)
def test_ordinals_from_the_accelerator_type(tmp_path, accelerator, ordinals):
    env = {"TPU_ACCELERATOR_TYPE": accelerator}
    target = tpu.detect(env, device_root(tmp_path))
    assert tpu.default_ordinals(target, env, tmp_path) == ordinals


def test_explicit_pjrt_devices(tmp_path):
    root = device_root(tmp_path)
    tpu_target = tpu.detect({"PJRT_DEVICE": "TPU"}, root)
    assert tpu_target.tpu and tpu.default_ordinals(tpu_target, {"TPU_NUM_DEVICES": "4"}, root) == 4
    cpu_target = tpu.detect({"PJRT_DEVICE": "cpu", "TPU_WORKER_ID": "0"}, root)
    assert (cpu_target.host, cpu_target.device) == (tpu.Host.XLA_CPU, "CPU")
    assert not cpu_target.tpu
    assert tpu.default_ordinals(cpu_target, {"CPU_NUM_DEVICES": "4"}, root) == 4
    assert tpu.default_ordinals(cpu_target, {}, root) == 1


def test_runtime_check_reads_only_an_already_imported_torch_xla(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert tpu.xla_runtime_initialized() is False
    assert "torch_xla" not in sys.modules  # asking never imports it
    fake = types.ModuleType("torch_xla")
    fake._XLAC = types.SimpleNamespace(_xla_runtime_is_initialized=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    assert tpu.xla_runtime_initialized() is False
    fake._XLAC = types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True)  # type: ignore[attr-defined]
    assert tpu.xla_runtime_initialized() is True


def _config(**overrides):
    values = dict(
        num_processes=None, start_method="auto", mixed_precision=None, gpu_ids=None,
        num_nodes=1, node_rank=0, rdzv_endpoint=None, max_restarts=0, timeout=None,
        output="all", progress="off", return_all=False,
    )
    values.update(overrides)
    return build_config(**values)


@pytest.fixture
def tpu_host(monkeypatch):
    """A TPU host with torch_xla installed (faked: the module exists, its runtime unused)."""
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v3-8")
    fake = types.ModuleType("torch_xla")
    fake._XLAC = types.SimpleNamespace(_xla_runtime_is_initialized=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla", fake)


def test_a_tpu_launch_defaults_to_every_core_from_a_clean_process(tpu_host):
    config = _config()
    assert (config.xla_device, config.num_processes) == ("TPU", 8)
    assert config.start.method.value == "forkserver"
    assert _config(num_processes=1).num_processes == 1


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"num_processes": 2}, ("num_processes=2", "every TPU core (8 here)")),
        ({"mixed_precision": "fp16"}, ("mixed_precision='fp16'", "bf16")),
        ({"max_restarts": 1}, ("max_restarts=1", "call notebook_launcher again")),
    ],
)
def test_unsupported_tpu_launches_are_refused_in_the_kernel(tpu_host, overrides, says):
    with pytest.raises(ValueError) as info:
        _config(**overrides)
    for fragment in says:
        assert fragment in str(info.value)


def test_initialised_runtime_refuses_fork_even_off_tpu(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    fake = types.ModuleType("torch_xla")
    fake._XLAC = types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    with pytest.raises(ValueError, match="start_method='spawn'"):
        _config(num_processes=2, start_method="fork")
    assert _config(num_processes=2, start_method="spawn").start.method.value == "spawn"
