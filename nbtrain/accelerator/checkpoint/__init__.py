"""Checkpoints: training state on disk written atomically (``state``, directories: ``dirs``), random
states (``rng``, ``seed``), stop points and the ranks' agreement (``stopping``) and resuming at
``prepare()`` (``resume``).
"""
