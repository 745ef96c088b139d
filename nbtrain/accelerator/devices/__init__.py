"""Devices: which device a rank computes on and which process-group backend it uses (``choice``),
and the Accelerator on XLA devices (TPU cores, XLA:CPU): its strategy, dataloader and
collectives backend (``xla*``).
"""
