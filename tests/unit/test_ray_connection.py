"""``cluster="ray"`` without a Ray connection: refused before Ray is imported (a connection needs
``ray.init``, which imports it), in words that fit where the user is, with a hint at a cluster
this machine knows of (RAY_ADDRESS, the address file ``ray start`` writes).

Measured (benchmarks/first_contact.py, 2 cores, load 12.9, 2026-11-28; the launcher already
imported): 0.5 ms and Ray never imported, against 2.7-3.7 s with Ray imported first before this
check (4.5-11 s in a newcomer's run). The kernel's wording: tests/kernel/test_launcher_kernel.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import sys, nbtrain
def f(): return 1
for call in (lambda: nbtrain.notebook_launcher(f, num_processes=2, cluster="ray"),
             lambda: nbtrain.start_ranks(2, cluster=nbtrain.RayCluster())):
    try:
        call()
    except Exception as exc:
        print(type(exc).__name__, exc)
print("ray imported:", "ray" in sys.modules)
"""


def ray_installed() -> None:
    # find_spec, not importorskip: importing Ray here would change this process's environment
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")


def run_script(tmp_path: Path, **env: str) -> list[str]:
    environ = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    environ.update(TMPDIR=str(tmp_path), **env)  # Ray's temp folder: tmp_path/ray
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=90,
        env=environ, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def test_a_script_without_ray_init_is_told_how_to_connect_and_ray_is_never_imported(tmp_path):
    ray_installed()
    launch, warm, imported = run_script(tmp_path)
    for line in (launch, warm):
        assert line.startswith(
            "RuntimeError cluster='ray' found no Ray connection in this "
            "Python process (call it in your script before the launch)"
        )
        assert "ray.init(address='auto')" in line and "ray://<head>:10001" in line
        assert "kernel" not in line, line
        assert "RAY_ADDRESS" not in line and "started on this machine" not in line
    assert imported == "ray imported: False"


def test_a_cluster_this_machine_knows_of_is_named(tmp_path):
    ray_installed()
    launch = run_script(tmp_path, RAY_ADDRESS="10.1.2.3:6379")[0]
    assert "RAY_ADDRESS is set ('10.1.2.3:6379'): ray.init() connects to it" in launch
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.9.8.7:6379\n")
    launch = run_script(tmp_path)[0]
    assert "a cluster started on this machine is at '10.9.8.7:6379'" in launch


def test_without_ray_installed_the_error_says_what_to_install(tmp_path):
    script = SCRIPT.replace("import sys, nbtrain", "import sys, nbtrain\nsys.modules['ray'] = None")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90, check=True)  # fmt: skip
    launch = done.stdout.splitlines()[0]
    assert launch.startswith("ImportError cluster='ray' needs Ray in this Python process")
    assert "pip install 'nbtrain[ray]'" in launch and "pip install -e '.[ray]'" in launch
