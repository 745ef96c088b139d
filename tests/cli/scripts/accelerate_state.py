"""Accelerate's own state in a script that ``nbtrain launch`` runs on every rank."""

from accelerate import PartialState

state = PartialState()
print(f"state {state.process_index} of {state.num_processes} {state.distributed_type} "
      f"main={state.is_main_process}")
