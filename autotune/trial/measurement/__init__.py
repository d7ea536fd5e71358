"""The instruments a measured run reads: the one clock every kind of job's loop drives (`clock`: warm-up
and the drain of batches made ahead, windows, the data wait, the losses, the result), the device clock
read after a sync, memory and utilisation (`measure`), the effects observed in the process rather than
the config echoed back (`observe`), and other processes' CPU use during the timed steps (`contention`).

May import: autotune.core and autotune.pipelines.
"""
