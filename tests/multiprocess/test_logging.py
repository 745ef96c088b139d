"""accelerator.logging.get_logger on real ranks: Accelerate's main_process_only / in_order."""

from __future__ import annotations

import pytest

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(120)


def log_from_every_rank() -> None:
    import logging
    import sys

    import torch.distributed as dist

    from nbtrain.accelerator.logging import get_logger

    # force: a forked rank inherits the handlers pytest put on the root logger.
    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s", force=True)
    dist.init_process_group("gloo")
    logger = get_logger("ported", log_level="INFO")
    rank = dist.get_rank()
    logger.info(f"main only from {rank}")
    logger.info(f"everyone from {rank}", main_process_only=False)
    logger.debug(f"debug from {rank}", main_process_only=False)  # below the level
    logger.info(f"in order from {rank}", in_order=True)
    logger.warning_once("said once")
    logger.warning_once("said once")
    dist.destroy_process_group()


def test_get_logger_logs_like_accelerate(capfd):
    notebook_launcher(log_from_every_rank, num_processes=2, progress="text")
    lines = capfd.readouterr().out.splitlines()
    logged = [line for line in lines if "INFO " in line or "WARNING " in line]
    assert [line for line in logged if "main only" in line] == ["[rank 0] INFO main only from 0"]
    assert sorted(line for line in logged if "everyone" in line) == [
        "[rank 0] INFO everyone from 0",
        "[rank 1] INFO everyone from 1",
    ]
    assert not [line for line in lines if "debug from" in line]
    assert sorted(line for line in logged if "in order" in line) == [
        "[rank 0] INFO in order from 0",
        "[rank 1] INFO in order from 1",
    ]
    assert [line for line in logged if "said once" in line] == ["[rank 0] WARNING said once"]
