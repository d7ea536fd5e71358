"""Example pipeline: a small decoder-only Transformer language model on synthetic tokens.

    autotune search --pipeline autotune.pipelines.examples.language_model:make [--image-size 128]

- Context length: `--image-size` (TrialConfig.image_size) is read as the sequence length in tokens,
  so the workload keeps one size knob (default 128 tokens; the minimum 32). It is part of the
  study's fingerprint, like the image size of an image pipeline.
- Data: sequences from a fixed random Markov chain over a 256-token vocabulary (each token has four
  likely successors), generated in memory, deterministic per seed. A model can learn it, so the loss
  falls, but there is nothing to decode: this workload has almost no data-loading cost, unlike the
  image pipelines, and the tuner should find that worker processes do not pay here.
- Items are (input_ids[:-1], input_ids[1:]), both LongTensors of shape (seq_len,).
- Model: token + position embeddings, 2 pre-norm nn.TransformerEncoderLayer blocks (d_model 128,
  4 heads) run with a causal mask, a final LayerNorm and a linear head over the vocabulary.
- activation checkpointing can wrap each block ("layers.0", "layers.1"). The blocks sit in a plain
  ModuleList rather than nn.TransformerEncoder because that class reads attributes of its first
  layer directly (layers[0].self_attn), which a checkpoint wrapper does not have.
- Size: `make` builds the model above; `make_w<width>_d<depth>` (e.g. `language_model:make_w1024_d16`)
  builds one `width` wide (d_model; 4 heads up to 256, then one per 64) and `depth` blocks deep. The size
  is in the pipeline's name, so it is part of the study's fingerprint and of every exported config, and
  each trial process builds the same model. At some size DDP, which keeps the whole model, its gradients
  and AdamW's two moments on every process, no longer fits where FSDP, which shards them, does.
- parallel=fsdp shards per block: the blocks are the checkpointing stages ("layers.0", ...).
- channels_last is unsupported: there are no 4-D tensors to lay out. A trial that asks for it exits
  with code 5; a search fixes it to false.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.core.errors import PipelineError

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.core.config import TrialConfig

VOCAB = 256
D_MODEL = 128
N_LAYERS = 2
N_HEADS = 4
N_SEQUENCES = 4096  # one epoch is 64 batches of 64: enough for any batch size and world size searched
SUCCESSORS = torch.tensor([0.6, 0.25, 0.1, 0.05])  # how likely each of a token's four successors is
CHAIN_SEED = 1234  # the "language" (transition table) is fixed; the seed picks the sequences drawn from it


def markov_tokens(n: int, length: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    """(n, length) int64 tokens from a fixed sparse Markov chain, deterministic per seed."""
    successors = torch.randint(0, vocab, (vocab, len(SUCCESSORS)), generator=torch.Generator().manual_seed(CHAIN_SEED))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(n, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    picks = torch.multinomial(SUCCESSORS, n * (length - 1), replacement=True, generator=g).view(n, length - 1)
    for t in range(length - 1):  # vectorised over sequences: `length` small steps
        tokens[:, t + 1] = successors[tokens[:, t], picks[:, t]]
    return tokens


class TokenDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens  # (n, seq_len + 1)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.tokens[i]
        return ids[:-1], ids[1:]  # views; the loader's collate stacks them into a fresh batch


class TinyLM(nn.Module):
    def __init__(
        self, seq_len: int, vocab: int = VOCAB, d_model: int = D_MODEL, n_layers: int = N_LAYERS, n_heads: int = N_HEADS
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model, n_heads, 4 * d_model, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        # True = may not attend. Bool, so it suits every autocast dtype.
        self.register_buffer("causal", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(n, device=ids.device))
        mask = self.causal[:n, :n]  # type: ignore[index]  # a registered buffer, a Tensor
        for layer in self.layers:
            # is_causal lets attention use its causal kernel; the mask is the contract it promises.
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))  # (batch, seq, vocab) logits


class LanguageModelPipeline:
    unsupported = frozenset({"channels_last"})

    def __init__(self, cfg: TrialConfig, width: int = D_MODEL, depth: int = N_LAYERS) -> None:
        self.seq_len = cfg.image_size  # see the module docstring: the workload's size knob is the context length
        self.seed = cfg.seed
        self.width, self.depth = width, depth
        self.stages = tuple(f"layers.{i}" for i in range(depth))

    def build_model(self) -> nn.Module:
        heads = N_HEADS if self.width <= 256 else self.width // 64
        return TinyLM(self.seq_len, d_model=self.width, n_layers=self.depth, n_heads=heads)

    def build_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return TokenDataset(markov_tokens(N_SEQUENCES, self.seq_len + 1, self.seed))

    def build_val_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return TokenDataset(markov_tokens(N_SEQUENCES // 8, self.seq_len + 1, self.seed + 1_000_003))

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Logits in fp32 for the softmax over the vocabulary, whatever autocast produced.
        return nn.functional.cross_entropy(output.float().flatten(0, 1), target.flatten())

    def metric(self, output: torch.Tensor, target: torch.Tensor) -> float:
        """Next-token accuracy."""
        return (output.argmax(dim=-1) == target).float().mean().item()


def make(cfg: TrialConfig) -> LanguageModelPipeline:
    return LanguageModelPipeline(cfg)


_SIZED = re.compile(r"make_w(\d+)_d(\d+)")


def __getattr__(name: str) -> Callable[[TrialConfig], LanguageModelPipeline]:
    """`make_w<width>_d<depth>`: the factory of a model that size (PEP 562: any size, by its name)."""
    m = _SIZED.fullmatch(name)
    if m is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    width, depth = int(m[1]), int(m[2])
    if width < 16 or width % (4 if width <= 256 else 64) or not 1 <= depth <= 1024:
        raise PipelineError(
            f"language_model:{name}: width must be a multiple of 4 from 16 to 256, or of 64 above "
            f"(one attention head per 64), and depth from 1 to 1024; got width {width}, depth {depth}"
        )

    def make_sized(cfg: TrialConfig) -> LanguageModelPipeline:
        return LanguageModelPipeline(cfg, width, depth)

    make_sized.__name__ = name
    return make_sized
