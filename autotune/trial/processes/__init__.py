"""Every fresh process a trial needs: the launcher (one way to start a worker, a probe or a training run:
forked from the warm server, plain, or under torchrun; on this machine or across nodes, `nodes` and
`torchx_nodes`), the warm fork server (`warm_client` is the controller's side, `warm_server` the
server, `warm_child` a forked trial), and the locks that keep trials off each other's devices and CPUs.
How a process ended is read back through `loop.outcome`, the one map from a cause to a status.

May import: autotune.core, autotune.pipelines, trial.loop and trial.measurement.
"""
