"""Example pipelines that show the tuner is not Unet-shaped. Each module has a `make(cfg)` factory:

    autotune search --pipeline autotune.pipelines.examples.classifier:make --budget 10m
    autotune search --pipeline autotune.pipelines.examples.language_model:make --budget 10m

- `classifier`: torchvision ResNet-18 on an ImageFolder-style set of JPEGs (DIR/<class>/*.jpg),
  decoded and augmented in the DataLoader's workers. Without --data it writes a small synthetic set
  once under studies/data/classifier-synthetic.
- `language_model`: a small decoder-only Transformer on synthetic Markov-chain tokens held in memory.
  Its context length is --image-size (the workload's one size knob); it has no 4-D tensors, so it takes no memory format (its `unsupported`).

They are written the way a user would write their own: only the Pipeline protocol, no tuning code.
"""
