"""The smallest pipeline autotune can tune: an MLP on random tensors (README, "Tune your own model").

PYTHONPATH=path/to/this/folder autotune search --pipeline my_pipeline:make --budget 5m
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset


class MyPipeline:
    stages = ("0", "2")  # optional: submodules checkpoint_segments may wrap, in forward order
    unsupported = {"channels_last"}  # optional: knobs this pipeline cannot honour (it has no images)

    def __init__(self, cfg):
        self.cfg = cfg  # the TrialConfig: cfg.seed, cfg.image_size, cfg.data_dir, ...

    def build_model(self):  # on the CPU, in fp32: autotune moves, wraps and compiles it
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))

    def build_dataset(self):  # items are (input, target); autotune builds the DataLoader
        return self._random(4096, seed=self.cfg.seed)

    def loss(self, output, target):  # runs under autocast: compute it in fp32
        return nn.functional.cross_entropy(output.float(), target)

    def build_val_dataset(self):  # optional, with metric(): `autotune train` validates with them
        return self._random(512, seed=self.cfg.seed + 1)

    def metric(self, output, target):
        return (output.argmax(dim=1) == target).float().mean().item()

    def _random(self, n, seed):
        x = torch.randn(n, 64, generator=torch.Generator().manual_seed(seed))
        return TensorDataset(x, x[:, :10].argmax(dim=1))  # a target the model can learn


def make(cfg):  # --pipeline my_pipeline:make
    return MyPipeline(cfg)
