"""The background warm-up (nbtrain/kernel/warmup.py): it never breaks a launch, and only an
interactive kernel starts it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nbtrain.kernel import forkserver, warmup


def test_a_failing_warm_up_is_dropped_and_leaves_the_launch_its_work(monkeypatch):
    def broken() -> None:
        raise OSError("no forkserver here")

    monkeypatch.setattr(forkserver, "start", broken)
    monkeypatch.setattr(warmup, "KERNEL_IMPORTS", ["nbtrain.no_such_module", "json"])
    warmup._warm()  # raises nothing: the launch starts the forkserver and imports itself


@pytest.mark.parametrize(
    ("frontend", "cell", "started"),
    [
        ("plain", "nbtrain.warm_up()", False),  # a script: nothing to warm up for
        ("ipython", "pass", False),  # import alone starts nothing (warm_up is opt-in)
        ("ipython", "nbtrain.warm_up()", True),
    ],
)
def test_only_warm_up_in_an_interactive_shell_starts_it(frontend, cell, started):
    shell = "from IPython.testing.globalipapp import start_ipython; ip = start_ipython(); "
    # (in a shell it begins once the cell that called warm_up() has finished)
    code = (
        shell + f"ip.run_cell('import nbtrain; {cell}'); "
        if frontend == "ipython"
        else f"import nbtrain; {cell}; "
    ) + "from nbtrain.kernel import warmup; print(warmup._thread is not None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == str(started), out.stderr
