"""The Accelerator: Hugging Face Accelerate's API, running in each rank.

``front.core.Accelerator`` is a front end that delegates; each concern is a sub-package, and
each imports only those listed before it (tests/unit/test_house.py checks it):

- ``comm`` (calls across ranks: transport, handshake, collectives; misuse detected instead of
  hanging; tensors inside nested containers);
- ``training`` (strategies by ``DistributedType``: DDP wrapping, gradient sync; precision,
  gradient accumulation, prepared optimizer and scheduler, uneven inputs);
- ``data`` (prepared dataloaders: who gets which samples, shuffling, dispatching);
- ``devices`` (which device and process-group backend; the XLA strategy, loader, collectives);
- ``checkpoint`` (atomic save_state / load_state, random states, stop and resume);
- ``tracking`` (experiment trackers), ``fsdp`` (FSDP2: plugin, strategy, sharded checkpoints);
- ``front`` (the ``Accelerator`` assembled from parts; Accelerate's state view, kwargs
  handlers and free functions).

``logging`` (Accelerate's ``get_logger``) sits beside them.

Rank side: imports ``nbtrain.rank`` and ``nbtrain.shared``, never the kernel side.
"""
