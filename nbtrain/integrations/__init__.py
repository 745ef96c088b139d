"""Adapters that report other libraries' training loops to nbtrain's live view. Rank side:
they report through ``nbtrain.rank.reporting``.

Each submodule imports its library itself, so ``import nbtrain`` never pulls them in.
"""
