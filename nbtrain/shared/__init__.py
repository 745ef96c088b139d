"""Both sides: plain records and their transport, no logic beyond that.

- ``events``: the frozen records a rank sends (Started, Progress, Log, Failed, ...) and their
  atomic framing over pipes; ``lines``: raw output bytes to whole lines.
- ``specs``: what the kernel decides for each rank (RankInfo, RankSpec, HostSpec).
- ``options``: the launch options' enums; ``errors``: WorkerError and friends.
- ``serialization``: cloudpickle for calls and results, only between our own processes.
- ``stacks``: the stack-dump format stuck ranks answer a timeout with.
- ``tpu``: TPU host facts (environment passed in); ``frontend`` and ``units``: which frontend
  this process serves and numbers as short text, for the kernel's views and a rank's text bar.
"""
