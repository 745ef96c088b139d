"""The kernel side: code that runs in the launching process (a Jupyter kernel, or
``nbtrain launch`` in a terminal). Nothing here is imported by a rank.

Layers along a launch's path, lowest first; each imports only those before it, type-only
imports included (tests/unit/test_house.py: KERNEL_LAYERS)::

    host/      what the kernel process is and has: os.environ, devices, cell names, stdin
    options/   what the user asked, checked once: Requested, config, Accelerate's options,
               stop/resume, debug, option names; the launch interface (UserCall,
               LaunchOptions, Launch: a kind built with its options)
    specs/     who each rank is, what it runs, where the ranks meet: rank specs, payload,
               rendezvous
    procs/     OS processes: start (fork/forkserver/spawn), signals, forkserver, warm-up,
               fork gc, shared memory
    group/     ONE RankGroup per set of rank processes: backends, the supervisor (the watch's
               turn; cell.py: warm commands' rules), wait() -> Ending (how the watch ended),
               interrupts, output order, pdb prompts, post-mortem, the outcome and its
               root-cause rule
    run/       one launch as the cell sees it: lifecycle (Run), its handle and runs() registry,
               cell output, tracebacks, where
    launch/    the kinds side by side, none importing another (inprocess, local, xla,
               elastic/, cluster/), and the chooser above them (choose.py: build_launch)
    warm/      warm ranks across cells (start_ranks) and the %%ranks magics
    cli/       the ``nbtrain`` command (launch, env, demo)
    entry.py   the public entry points: notebook_launcher, debug_launcher

Rank entry points are named through ``nbtrain.rank``'s trampolines, so importing this package
loads no rank logic; the display (nbtrain/display) draws a RunState the kernel feeds.
"""
