"""FSDP2: the plugin and its checks (``plugin``), the strategy that shards models (``strategy``),
their sharded checkpoints (``checkpoint``), and the Accelerator's choice of it (``setup``).
"""
