"""What every rank starts with already imported: imported once by the process ranks are made
from (the kernel before a fork launch, or the forkserver), so that no rank imports it again."""

from __future__ import annotations

# torch._dynamo is imported by the first optimizer or DDP a rank creates and costs seconds per
# rank per launch otherwise; it starts no threads, so forking after it is safe.
# (encodings.idna: every rank's first getaddrinfo of a host name imports it)
WARM_IMPORTS = ["torch", "torch.distributed", "torch._dynamo", "cloudpickle", "encodings.idna"]
# The rank side's entries: a launch's rank and a warm rank (no rank imports them on its own).
RANK_SIDE = ["nbtrain.rank.worker", "nbtrain.rank.session"]
PRELOAD = [*WARM_IMPORTS, *RANK_SIDE]
