"""The Accelerator: Hugging Face Accelerate's API, running in each rank.

``core.Accelerator`` is a front end that delegates; each concern has its own module:

- ``devices`` (which device, which process-group backend), ``parallel`` (strategies by
  ``DistributedType``: DDP wrapping, gradient sync), ``precision`` (autocast, grad scaler),
  ``accumulation`` (gradient accumulation state), ``optim`` (prepared optimizer and scheduler);
- ``data`` (prepared dataloaders), ``sharding`` / ``splitting`` (who gets which samples),
  ``nested`` (tensors inside nested containers);
- ``collectives`` (gather, reduce, broadcast, pad; misuse detected instead of hanging),
  ``checkpoint`` (atomic save_state / load_state), ``rng`` and ``seed`` (random states);
- ``compat`` and ``handlers`` (Accelerate's state, project configuration, kwargs handlers),
  ``logging`` (Accelerate's ``get_logger``), ``xla`` (the backend on torch_xla devices).

Rank side: imports ``nbtrain.rank`` and ``nbtrain.shared``, never the kernel side.
"""
