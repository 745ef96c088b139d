"""How a training step runs: the parallel strategy by ``DistributedType`` (process group, DDP
wrapping, gradient sync: ``parallel``), mixed precision, gradient accumulation, the prepared
optimizer and scheduler, and uneven inputs (``join``).
"""
