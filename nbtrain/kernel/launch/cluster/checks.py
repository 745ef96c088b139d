"""What the kernel checks on the nodes once Ray has placed the rank actors, before any rank
starts: the nodes run the kernel's Python, torch and nbtrain (the function is pickled here and
unpickled there), and a launch that saves or resumes checkpoints sees the same folder on every
node as in the kernel (a checkpoint written by rank 0's node is read back on another)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from nbtrain.kernel.launch.cluster.relay import Node
from nbtrain.shared import checkpoints
from nbtrain.shared.stopping import StopPolicy


def check_versions(kernel: Mapping[str, str], nodes: Mapping[Node, Mapping[str, str]]) -> None:
    """An error naming each node whose versions differ from the kernel's, and the fix."""
    differ: dict[str, str] = {}  # what -> the kernel's version
    lines = []
    for node, found in nodes.items():
        wrong = [name for name in kernel if found.get(name) != kernel[name]]
        if wrong:
            differ.update({name: kernel[name] for name in wrong})
            have = ", ".join(f"{name} {found.get(name, 'missing')}" for name in wrong)
            lines.append(f"  {node.describe()}: {have}")
    if not lines:
        return
    mine = ", ".join(f"{name} {version}" for name, version in differ.items())
    packages = [f"{name}=={version}" for name, version in differ.items() if name != "Python"]
    fixes = []
    if packages:
        fixes.append(
            f"install this kernel's versions on every node (pip install {' '.join(packages)}), "
            f"or let Ray install them for the ranks: nbtrain.RayCluster(runtime_env="
            f"{{'pip': {packages!r}}})"
        )
    if "Python" in differ:
        fixes.append(f"run Python {differ['Python']} on every node (the same image as this kernel)")
    raise RuntimeError(
        "the Ray cluster's nodes do not run what this kernel runs (this kernel: "
        f"{mine}), so they could not run the function it pickles:\n" + "\n".join(lines)
        + "\nTo fix: " + "; ".join(fixes) + ". Nothing was started."
    )


@contextlib.contextmanager
def shared_paths(policy: StopPolicy | None) -> Iterator[list[str]]:
    """The paths every node must see for the launch's checkpoints: a marker written now in the
    checkpoint folder (when the launch saves), the checkpoint it resumes from; removed after."""
    paths = []
    marker = None
    if policy is not None and (policy.on_interrupt or policy.every_steps or policy.every_seconds):
        folder = checkpoints.automatic_parent(policy.project_dir)
        marker = folder / f".nbtrain-shared-{uuid.uuid4().hex}"
        marker.write_text("written by the kernel: every node of the cluster must see this file\n")
        paths.append(str(marker))
    if policy is not None and policy.resume_from is not None:
        paths.append(policy.resume_from)
    try:
        yield paths
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)


def check_shared(paths: list[str], seen: Mapping[Node, list[bool]]) -> None:
    """An error naming the nodes that do not see the kernel's checkpoint paths."""
    lines = [
        f"  {node.describe()} does not see "
        + ", ".join(repr(str(Path(path).parent if ".nbtrain-shared-" in path else path))
                    for path, there in zip(paths, found, strict=True) if not there)
        for node, found in seen.items()
        if not all(found)
    ]
    if lines:
        raise RuntimeError(
            "on_interrupt='checkpoint', checkpoint_every= and resume= on a cluster need the "
            "checkpoint folder on storage that this kernel and every node share, at the same "
            "path (NFS, a parallel or cloud filesystem mounted on each node):\n"
            + "\n".join(lines)
            + "\nPass project_dir= (or resume_from=) a folder on such storage. Nothing was "
            "started."
        )


__all__ = ["check_shared", "check_versions", "shared_paths"]
