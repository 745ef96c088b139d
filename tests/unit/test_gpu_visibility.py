"""What a GPU user is told, checked with the GPU mocked at torch's own calls (the hardware CI
lacks; benchmarks/gpu runs the real thing): which notebook line initialised CUDA, the fork
refusal and auto's title that name it, the GPU and its memory in a rank's row, and the cards
`nbtrain env` lists."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from nbtrain.display.formatting import format_status
from nbtrain.display.runstate import RankStatus, RunState
from nbtrain.kernel.cli import envreport
from nbtrain.kernel.host import cuda_origin, environment
from nbtrain.kernel.options import config
from nbtrain.rank import gpu_usage
from nbtrain.shared.events import GpuUsage, Started


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A CUDA build whose context starts on the first _lazy_init (as torch's does)."""
    state = SimpleNamespace(initialized=False, inits=0)

    def lazy_init() -> None:
        state.inits += 1
        state.initialized = True

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state.initialized)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    monkeypatch.setattr(cuda_origin, "_origin", None)
    monkeypatch.setattr(cuda_origin, "_watching", False)
    return state


def test_the_cell_that_initialised_cuda_is_named(fake_cuda: SimpleNamespace) -> None:
    cuda_origin.watch()
    shell = InteractiveShell.instance()
    try:
        shell.run_cell("x = 1", store_history=True)
        shell.run_cell("import torch\ny = 2\ntorch.cuda._lazy_init()", store_history=True)
        shell.run_cell("torch.cuda._lazy_init()", store_history=True)  # not the first: ignored
        count = shell.execution_count - 2
    finally:
        InteractiveShell.clear_instance()
    assert fake_cuda.inits == 2  # torch's own init still runs
    assert cuda_origin.origin() == f"Cell In[{count}], line 3: torch.cuda._lazy_init()"
    assert cuda_origin.explain() == f"CUDA was initialised by Cell In[{count}], line 3: " \
        "torch.cuda._lazy_init()."


def test_outside_a_notebook_the_file_and_line_are_named(fake_cuda: SimpleNamespace) -> None:
    cuda_origin.watch()
    torch.cuda._lazy_init()
    assert cuda_origin.origin() == f"{__file__}, line {_line_of('    torch.cuda._lazy_init()')}" \
        ": torch.cuda._lazy_init()"


def test_cuda_initialised_before_nbtrain_cannot_be_located(fake_cuda: SimpleNamespace) -> None:
    fake_cuda.initialized = True
    cuda_origin.watch()  # too late: nothing to learn
    assert cuda_origin.origin() is None
    assert "before nbtrain was imported" in cuda_origin.explain()


def test_fork_refusal_and_autos_choice_name_the_line(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda_origin.watch()
    torch.cuda._lazy_init()
    monkeypatch.setattr(environment, "fork_poisons_cuda", lambda: True)
    with pytest.raises(ValueError, match=r"forkserver.*CUDA was initialised by .*test_gpu"):
        config.choose_start_method("fork", uses_cuda=True)
    chosen = config.choose_start_method("auto", uses_cuda=True)
    assert chosen.method.value == "forkserver"
    assert chosen.note.startswith("not fork: CUDA was initialised by ")
    assert config.choose_start_method("auto", uses_cuda=False).note == ""


def test_a_rank_row_shows_its_gpu_and_memory() -> None:
    state = RunState([0, 1], title="2 ranks")
    state.apply(Started(0, 10, "cuda:0", "host"))
    state.apply(Started(1, 11, "cpu", "host"))
    state.apply(GpuUsage(0, "NVIDIA H100 80GB HBM3", 3 * 2**30 + 2**29, 80 * 2**30))
    assert format_status(state.ranks[0]) == "running · NVIDIA H100 80GB HBM3 · 3.5 GiB"
    assert format_status(state.ranks[1]) == "running"  # a CPU rank says nothing of GPUs
    state.ranks[0].status = RankStatus.DONE
    assert format_status(state.ranks[0]).startswith("done · NVIDIA H100")


def test_gpu_usage_is_sent_only_once_cuda_is_used_and_when_it_moves(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    reserved = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: reserved[0])
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(name="NVIDIA T4", total_memory=16 * 2**30))
    sampler = gpu_usage.GpuSampler(rank=1)
    assert sampler.sample() is None  # CUDA not initialised here: a CPU rank
    fake_cuda.initialized = True
    reserved[0] = 2**30
    first = sampler.sample()
    assert first == GpuUsage(1, "NVIDIA T4", 2**30, 16 * 2**30, first.time)
    assert sampler.sample() is not None  # not acknowledged as sent: offered again
    sampler.sent(first)
    reserved[0] += gpu_usage.STEP - 1
    assert sampler.sample() is None  # a small move is not worth an update
    reserved[0] += 1
    assert sampler.sample().reserved == 2**30 + gpu_usage.STEP


def test_nbtrain_env_lists_each_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA A100-SXM4-40GB, 40960 MiB, 550.54.15'\n"
                   "echo '1, NVIDIA A100-SXM4-40GB, 40960 MiB, 550.54.15'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    report = envreport.report()
    assert "GPU 1" in report and "NVIDIA A100-SXM4-40GB, 40960 MiB, driver 550.54.15" in report


def test_nbtrain_env_without_nvidia_smi_lists_no_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert environment.gpu_descriptions() == []


def _line_of(text: str) -> int:
    return Path(__file__).read_text().splitlines().index(text) + 1
