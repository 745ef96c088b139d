"""The kernel side: code that runs in the launching process (a Jupyter kernel, or
``nbtrain launch`` in a terminal). Nothing here is imported by a rank.

One way through, no back and forth::

    launcher    the public entry points: their parameters become one options.Requested
    options     the options checked once (LaunchOptions), the launch kind picked (launch.py)
    launch      ONE launch interface (Launch: check, run), chosen in one place; the kinds:
      inprocess   num_processes=1, in the kernel itself
      local       ranks on this machine          (processes.py, rendezvous.py)
      xla         torch_xla's host process       (the ordinals are ranks)
      elastic/    torch's elastic agent          (multi-node, restarts, nbtrain launch)
      cluster/    ranks placed by Ray            (a RankGroup backend)
    run         ONE lifecycle per launch (Run): state, view, interrupt, timeout, outcome,
                and the one ending (finish) for every kind, in process too
    group/      ONE RankGroup owns the rank processes of local, XLA, elastic and warm launches:
                start through a backend (LocalProcesses), the one watch loop, the one Ctrl-C
                policy, stacks, stop, close
    supervisor  the group's channel: the non-blocking loop over every rank's pipes and exit
    outcome     results and the root-cause rule (the per-rank model the views draw, RunState,
                is display/runstate.py: the kernel feeds it events; display imports no kernel)
    warm/       warm ranks across cells (start_ranks): one Run per command; magics: %%ranks

Also here: ``environment`` (the kernel's one reader of os.environ and of what the machine
offers), ``shm`` (what killed ranks leave in /dev/shm), ``cli`` / ``envreport`` / ``demo`` (the
``nbtrain`` command). Rank entry points are named through ``nbtrain.rank``'s trampolines, so
importing this package loads no rank logic.
"""
