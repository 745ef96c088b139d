"""TPU / XLA detection for each hosting environment, with the environment faked: explicit
environment mappings and a fake device-file root (never the launcher mocked). Runs in the main
venv: nothing here imports torch_xla."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from nbtrain.kernel.options.config import build_config
from nbtrain.shared import tpu

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


def pci_root(tmp_path: Path, *devices: str, vendor: str = "0x1ae0") -> Path:
    """A fake /sys/bus/pci/devices with one function per device id (a Google TPU by default)."""
    for index, device in enumerate(devices):
        function = tmp_path / "sys" / "bus" / "pci" / "devices" / f"0000:00:{index + 4:02x}.0"
        function.mkdir(parents=True)
        (function / "vendor").write_text(vendor + "\n")
        (function / "device").write_text(device + "\n")
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
    [
        ("v2-8", 8),
        ("v3-8", 8),
        ("v3-32", 8),  # one host of four: 4 chips x 2 cores
        ("v4-8", 4),  # 4 megacore chips, one device each
        ("v4-16", 4),  # one host of two
        ("v5p-8", 4),  # like v4: the number counts TensorCores, 2 per chip
        ("v5litepod-4", 4),  # v5e counts chips
        ("v5litepod-8", 8),
        ("v5litepod-16", 4),  # one host of four 4-chip hosts
        ("v6e-8", 8),
    ],
)
def test_ordinals_from_the_accelerator_type(tmp_path, accelerator, ordinals):
    env = {"TPU_ACCELERATOR_TYPE": accelerator}
    target = tpu.detect(env, device_root(tmp_path))
    assert tpu.default_ordinals(target, env, tmp_path) == ordinals


@pytest.mark.parametrize(
    ("chips", "env", "ordinals"),
    [
        (["0x0027"] * 4, {}, 8),  # v2/v3: 2 TensorCores per chip
        (["0x005e"] * 4, {}, 4),  # v4: one device per chip
        (["0x0063"] * 8, {}, 8),  # v5e
        (["0x006f"] * 4, {}, 4),  # v6e
        (["0x0062"] * 4, {"TPU_ACCELERATOR_TYPE": "v5p-8"}, 4),  # id unknown, type says v5p
        (["0x0027"] * 4, {"TPU_PROCESS_BOUNDS": "1,1,1"}, 2),  # torch_xla starts one process
    ],
)
def test_ordinals_as_torch_xla_counts_them_from_the_pci_bus(tmp_path, chips, env, ordinals):
    root = pci_root(tmp_path, *chips)
    target = tpu.detect(env, root)
    assert target.tpu and "on the PCI bus" in target.reason
    count = tpu.count_ordinals(target, env, root)
    assert count.count == ordinals
    assert "PCI" in count.source or "TPU_PROCESS_BOUNDS" in count.source


def test_other_pci_devices_are_no_tpu(tmp_path):
    root = pci_root(tmp_path, "0x0027", vendor="0x8086")  # Intel, whatever the device id
    assert tpu.tpu_pci_chips(root) == []
    assert tpu.detect({}, root).host is tpu.Host.NONE


def test_device_files_count_chips_not_cores_from_v4_on(tmp_path):
    root = device_root(tmp_path, "accel0", "accel1", "accel2", "accel3")
    target = tpu.detect({}, root)
    # Generation unknown: the v2-8/v3-8 of Colab and Kaggle (2 cores per chip) ...
    assert tpu.default_ordinals(target, {}, root) == 8
    # ... but a v4 chip is one device, as torch_xla counts it (not 8: it was doubled before).
    assert tpu.default_ordinals(target, {"TPU_ACCELERATOR_TYPE": "v4-8"}, root) == 4
    assert tpu.default_ordinals(target, {"TPU_ACCELERATOR_TYPE": "v5p-8"}, root) == 4


def test_explicit_pjrt_devices(tmp_path):
    root = device_root(tmp_path)
    tpu_target = tpu.detect({"PJRT_DEVICE": "TPU"}, root)
    assert tpu_target.tpu
    # Nothing to count on: the common v2-8/v3-8, said so. (torch_xla 2.9 ignores
    # TPU_NUM_DEVICES, so nbtrain does too.)
    count = tpu.count_ordinals(tpu_target, {"TPU_NUM_DEVICES": "4"}, root)
    assert count.count == 8 and "assumed" in count.source
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


def test_libtpu_is_found_where_torch_xla_looks_for_it(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert tpu.libtpu_installed({}) is False  # none in this environment
    library = tmp_path / "libtpu.so"
    library.touch()
    assert tpu.libtpu_installed({"TPU_LIBRARY_PATH": str(library)}) is True
    package = tmp_path / "site" / "libtpu"  # the package `pip install torch_xla[tpu]` brings
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert tpu.libtpu_installed({}) is True
    assert "libtpu" not in sys.modules  # found, not imported


def test_libtpu_bundled_with_torch_xla(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    bundled = tmp_path / "torch_xla"
    (bundled / "lib").mkdir(parents=True)
    fake = types.ModuleType("torch_xla")
    fake.__file__ = str(bundled / "__init__.py")
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    assert tpu.libtpu_installed({}) is False
    (bundled / "lib" / "libtpu.so").touch()
    assert tpu.libtpu_installed({}) is True


@pytest.fixture
def tpu_host(monkeypatch, tmp_path):
    """A TPU host with torch_xla installed (faked: the module exists, its runtime unused)."""
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v3-8")
    (tmp_path / "libtpu.so").touch()
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(tmp_path / "libtpu.so"))
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


def test_a_tpu_launch_without_libtpu_is_refused_in_the_kernel(tpu_host, monkeypatch):
    monkeypatch.delenv("TPU_LIBRARY_PATH")
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    with pytest.raises(ValueError) as info:
        _config()
    assert "libtpu" in str(info.value) and "pip install 'torch_xla[tpu]'" in str(info.value)
    assert "PJRT_DEVICE=CPU" in str(info.value)


def test_initialised_runtime_refuses_fork_even_off_tpu(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    fake = types.ModuleType("torch_xla")
    fake._XLAC = types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    with pytest.raises(ValueError, match="start_method='spawn'"):
        _config(num_processes=2, start_method="fork")
    assert _config(num_processes=2, start_method="spawn").start.method.value == "spawn"


def test_the_launch_counts_the_ordinals_once(tpu_host, monkeypatch):
    from nbtrain.kernel.launch import xla

    config = _config()
    assert config.xla_counted == "TPU_ACCELERATOR_TYPE=v3-8"
    assert _config(num_processes=1).xla_counted == "num_processes=1"

    def second_look(*args, **kwargs):
        raise AssertionError("the launch detected or counted the TPU again")

    # The host's "expected N (why)" comes from the kernel's own count, not a second detection.
    monkeypatch.setattr(tpu, "detect", second_look)
    monkeypatch.setattr(tpu, "count_ordinals", second_look)
    assert xla.counted_from(config) == "TPU_ACCELERATOR_TYPE=v3-8"


def test_an_xla_cpu_launch_says_where_its_ordinal_count_comes_from(tpu_host, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    config = _config(num_processes=4)
    assert (config.xla_device, config.xla_counted) == (
        "CPU",
        "CPU_NUM_DEVICES=4, from num_processes",
    )
