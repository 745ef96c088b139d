"""``get_logger``: Accelerate's multi-process logger, for code ported by changing the import.

``from accelerate.logging import get_logger`` becomes
``from nbtrain.accelerator.logging import get_logger``:
records go to the standard ``logging`` machinery, by default from the main process only
(``main_process_only=False`` logs on every rank, ``in_order=True`` rank after rank).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import MutableMapping
from typing import Any

from nbtrain.rank.rankenv import default_log_level, placement


class MultiProcessAdapter(logging.LoggerAdapter):
    """A LoggerAdapter whose calls take ``main_process_only`` and ``in_order``."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        where = placement()
        if in_order and where.world_size > 1:
            self._in_order(where.rank, where.world_size, level, msg, args, kwargs)
        elif not main_process_only or where.rank == 0:
            msg, kwargs = self.process(msg, kwargs)
            self.logger.log(level, msg, *args, **kwargs)

    def _in_order(
        self, rank: int, world: int, level: int, msg: object, args: Any, kwargs: Any
    ) -> None:
        # Every rank must make this call (as in Accelerate): one barrier per turn.
        import torch.distributed as dist

        for turn in range(world):
            if turn == rank:
                message, options = self.process(msg, kwargs)
                self.logger.log(level, message, *args, **options)
            if dist.is_available() and dist.is_initialized():
                dist.barrier()

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs

    @functools.lru_cache(None)  # noqa: B019 - one warning per message, as in Accelerate
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """The logger ``name`` wrapped for several processes; ``log_level`` sets its level (as the
    environment variable ACCELERATE_LOG_LEVEL does in Accelerate, which is honoured too)."""
    logger = logging.getLogger(name)
    level = log_level or default_log_level()
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
