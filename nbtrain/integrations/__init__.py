"""Adapters that report other libraries' training loops to nbtrain's live view.

Each submodule imports its library itself, so ``import nbtrain`` never pulls them in.
"""
