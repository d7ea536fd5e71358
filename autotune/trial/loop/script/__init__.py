"""A user's script in a trial: how an unedited script gets tuned. It runs as written in the trial's process
(runpy, with its own sys.argv and `__name__ == "__main__"`: `running`), with autotune's seams installed in
torch before it starts (`seams`); each knob's part, how it reaches the script, what it observes and what
the trial records of it, is one module:

  - `loader`: the trial's num_workers, pin_memory, prefetch_factor, persistent_workers replace the
    script's own DataLoader arguments (DataLoader.__init__ wrapped); a config with a data seed (parity's
    data-order twin) hands each DataLoader a generator seeded with it;
  - `optimizer`: the fused/foreach flags, set on its param groups before GradScaler or its first step sees
    it (GradScaler.unscale_/step wrapped, and a global step pre-hook: GradScaler picks its path by the
    optimizer's flags, so a flag switched inside step() would hand a foreach step a fused step's scale);
    zero_grad(set_to_none) on optimizers and modules. The process flags and the thread count are set before
    the script runs (trial/loop/knobs/);
  - `loader` hands the trial's micro-batch to each DataLoader built with the script's own batch (a script
    with none calls at.batch_size(), and at.accumulation() under a study's global batch); `batch`: what is
    handed over, and the lr for the trial's global batch: the lr each optimizer's constructor is given,
    scaled by the study's rule from the script's own global batch (Optimizer.__init__ wrapped, so a schedule
    built on it keeps its shape); a script that calls at.lr() scales its own. Where the first step delivers
    another global batch (a script that divides its accumulation by the world size), the lr and its
    schedules are set for the batch run before that step updates anything. The samples of a step are what
    its loaders delivered, else at.batch_size() x at.accumulation() as handed over;
  - the model its optimizer trains, with no edit (`model`, which finds it at its first call): the model
    knobs of the knob list (autotune/core/knobs/), in its order, with the ranks' replicate (`ranks`) where
    the list puts data-parallel, each applied in place by its torch side (trial/loop/knobs/) and observed,
    unless the at.* call its module names routes it (at.autocast(), at.model());
  - gpus: the script runs under torchrun, one process per GPU, each rank with these seams. A script that
    sets up its own process group keeps its own DDP set-up, untouched; for one that sets up none the trial
    sets it up, replicates the model in place and shards its training DataLoaders, and other ranks than 0
    print nothing and skip torch.save (`ranks`). The world size and the global batch are what the run showed.
Measurement is the trial's one Clock, made when the script first fetches or steps, on the device its
tensors live on: each loader the script starts iterating is told to it, a global optimizer-step post-hook
ends each step, the time blocked in the DataLoader iterator's __next__ is the data wait, each backward()'s
scalar (a copy) is the step's loss. After the timed steps the hook closes the clock, reads what the run
showed, and the clock ends the script (WindowOver). The baseline (`baseline`) runs the script's own settings,
overriding nothing. The seams hand what the run showed over as one record (`shown`); `records` turns it into
each knob's effect, the construction sites the diff edits (`sites`) and what the run showed, in the trial's
`applied`. The static reading of the script (what it calls, its
own batch and lr rule) is autotune.pipelines.script, which the search and the export read without torch.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""
