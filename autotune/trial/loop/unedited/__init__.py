"""The seams that reach the model an unedited script trains, with no `at.*` call: one module a knob.

The model is the outermost module the script calls whose parameters its optimizer holds (model.py: found
at its first forward after the optimizer is built, by global module hooks removed once it is found). On
it, in place and in one fixed order:
  - checkpoint_segments: torch's composable activation checkpointing on the first k of its repeated blocks
    (its longest ModuleList or Sequential of like modules) (checkpointing.py);
  - channels_last: `Module.to(memory_format=torch.channels_last)`, which keeps the parameters the optimizer
    holds, and 4-D inputs converted at its forward pre-hook (channels_last.py);
  - precision: autocast entered at its forward pre-hook and left at its forward hook, its floating outputs
    handed back in fp32, so a loss computed outside it runs in fp32 as under autocast (precision.py).
Each records what it observed (the output dtype inside the model, the weights' memory format, the wrappers
present), so the trial's `applied` says what ran, never the config's echo. A knob that cannot apply (two
optimizers, no convolution, no repeated blocks) raises TrialUnsupported with one line of why (exit 5).

May import: autotune.core, autotune.pipelines (torch's own modules for the rest).
"""
