"""Which generator orders a prepared loader's samples, and how every rank gets the same order.

Sharding cuts one global order of batches into per-rank shares, so every rank must draw the
*same* order, or samples are duplicated and others never seen. Two ways, as in Accelerate:

- **follow** (the default): the order comes from the sampler's own generator, the user's
  object (``DataLoader(..., generator=g)``), so ``g.manual_seed(42)`` after ``prepare()`` takes
  effect and a seeded run on N ranks draws what one process would. At the start of each pass
  rank 0's generator state is sent to every rank (user code may have touched the generator on
  one rank only). A sampler without a generator gets a private one, seeded once with the seed
  the ranks agreed on (``DataLoaderConfiguration(data_seed=)`` fixes it); it advances alike on
  every rank, so it needs no message.
- **seedable** (``use_seedable_sampler=True``, and XLA, whose ordinals share one process): a
  private generator is seeded with ``seed + epoch`` before each pass (Accelerate's
  SeedableRandomSampler), so any epoch's order can be drawn again from its number.

Checkpoints hold the generator state the current pass started from (follow mode), so a
resumed pass replays the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Share = Callable[[Any], Any]  # rank 0's value, returned on every rank (a broadcast)


class Shuffling:
    """The generator one prepared loader's samplers draw from, kept equal on every rank."""

    def __init__(
        self, seed: int, *, seedable: bool, follow_user: bool, share: Share | None
    ) -> None:
        self.seed = seed
        self.seedable = seedable
        self.follow_user = follow_user and not seedable
        self.share = share  # None in a world of one: nothing to agree on
        self.generator: torch.Generator | None = None
        self.own = True  # the generator is private (not the user's object)
        self.hooks: list[Any] = []  # objects with set_epoch (samplers, datasets)
        self._pass_state: torch.Tensor | None = None  # state the current pass started from
        self._restore: torch.Tensor | None = None  # a checkpoint's state for the next pass

    def adopt(self, user_generator: torch.Generator | None) -> torch.Generator:
        """The generator a sampler copy draws from (one per loader, whatever the nesting)."""
        if self.generator is None:
            if self.follow_user and isinstance(user_generator, torch.Generator):
                self.generator, self.own = user_generator, False
            else:
                self.generator = torch.Generator()
                self.generator.manual_seed(self.seed)
        return self.generator

    def apply(self, epoch: int) -> None:
        """Before a pass: bring the generator to this pass's starting state on every rank, and
        tell the set_epoch hooks the epoch."""
        generator = self.generator
        if generator is not None:
            if self.seedable:
                generator.manual_seed(self.seed + epoch)
            elif self._restore is not None:
                generator.set_state(self._restore)
                self._restore = None
            elif not self.own and self.share is not None:
                generator.set_state(self.share(generator.get_state()))
            self._pass_state = generator.get_state()
        for hook in self.hooks:
            hook.set_epoch(epoch)

    def state(self, mid_pass: bool) -> torch.Tensor | None:
        """What a checkpoint keeps: the state the current pass started from (mid-pass), else
        the state the next pass will start from."""
        if self.seedable or self.generator is None:
            return None
        if self._restore is not None:  # loaded, not replayed yet
            return self._restore.clone()
        if mid_pass and self._pass_state is not None:
            return self._pass_state.clone()
        return self.generator.get_state()

    def restore(self, state: torch.Tensor | None) -> None:
        """The next pass starts from ``state`` (set then, not now: the pass may be replayed)."""
        if state is not None and not self.seedable:
            self._restore = torch.as_tensor(state, dtype=torch.uint8).clone()
