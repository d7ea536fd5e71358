"""Tiny transformers jobs for the tests: a GPT-2 built from a config (no download) on random tokens, with
the user's base TrainingArguments, and factories that return the wrong things (`--pipeline hf:tests.pipelines.hf_jobs:...`)."""

from __future__ import annotations

from typing import Any

import torch
import transformers


def _model(seed: int) -> transformers.GPT2LMHeadModel:
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def _tokens(seed: int, n: int = 256) -> list[dict[str, torch.Tensor]]:
    # A learnable sequence: each token is the previous one plus one (mod 64), from a random start.
    start = torch.randint(0, 64, (n, 1), generator=torch.Generator().manual_seed(seed))
    ids = (start + torch.arange(16)) % 64
    return [{"input_ids": t, "labels": t} for t in ids]


def base_args(**kw: Any) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(
        output_dir="out", per_device_train_batch_size=8, learning_rate=3e-3, report_to="none", **kw
    )


def make(cfg: Any) -> tuple[Any, Any, Any, Any]:
    return _model(cfg.seed), _tokens(cfg.seed), transformers.default_data_collator, base_args()


def sgd(cfg: Any) -> tuple[Any, Any, Any, Any]:
    """The user trains with SGD: the fusion knob (AdamW kernels) cannot express that."""
    return _model(cfg.seed), _tokens(cfg.seed), transformers.default_data_collator, base_args(optim="sgd")


def three_parts(cfg: Any) -> tuple[Any, Any, Any]:
    return _model(cfg.seed), _tokens(cfg.seed), base_args()
