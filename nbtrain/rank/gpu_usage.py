"""The GPU a rank uses and the memory it holds there, for its row in the live view.

Read only once this process has initialised CUDA itself (never initialised here: a rank that
trains on the CPU stays off the GPU), from torch's own counters: ``memory_reserved`` is what the
caching allocator took from the card for this process, the figure that grows until the card is
full. A new value goes out when it moved by at least STEP, so a steady run sends nothing.
"""

from __future__ import annotations

import sys

from nbtrain.shared.events import GpuUsage

STEP = 64 * 2**20  # bytes: smaller moves are not worth a row update


class GpuSampler:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._sent: int | None = None
        self._card: tuple[str, int] | None = None  # (name, total bytes) of the current device

    def sample(self) -> GpuUsage | None:
        """The usage to send now, or None (no GPU in use here, or nothing changed enough)."""
        torch = sys.modules.get("torch")
        if torch is None or torch.version.cuda is None or not torch.cuda.is_initialized():
            return None
        device = torch.cuda.current_device()
        reserved = int(torch.cuda.memory_reserved(device))
        if self._sent is not None and abs(reserved - self._sent) < STEP:
            return None
        if self._card is None:
            properties = torch.cuda.get_device_properties(device)
            self._card = (properties.name, int(properties.total_memory))
        name, total = self._card
        return GpuUsage(self.rank, name, reserved, total)

    def sent(self, usage: GpuUsage) -> None:
        """``usage`` reached the kernel: the next one goes out after a move of STEP."""
        self._sent = usage.reserved
