"""Checkpoints: training state on disk written atomically (``state``, directories: ``dirs``,
automatic naming: ``automatic``), random states (``rng``, ``seed``), stop points and the ranks'
agreement (``stopping``) and resuming at ``prepare()`` (``resume``).
"""
