"""The default pipeline: smp Unet('resnet34') for binary person segmentation (`pipeline`), and its data
(`data`): a deterministic synthetic set (`autotune make-data`) and the folder reader for a user's own.
Kept apart so `make-data` and folder checks never import torch.
"""
