"""The instruments a measured run reads: the one clock every kind of job's loop and every probe drives
(`clock`: warm-up and the drain of batches made ahead, the timed window and when it is over, windows,
the data wait, the samples counted, the losses, the result), how many samples a batch holds (`samples`:
the one count), the device clock read after a sync, memory and utilisation (`measure`), the effects
observed in the process rather than the config echoed back (`observe`), and other processes' CPU use
during the timed steps (`contention`).

May import: autotune.core and autotune.pipelines.
"""
