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
- checkpoint_segments can wrap each block ("layers.0", "layers.1"). The blocks sit in a plain
  ModuleList rather than nn.TransformerEncoder because that class reads attributes of its first
  layer directly (layers[0].self_attn), which a checkpoint wrapper does not have.
- channels_last is unsupported: there are no 4-D tensors to lay out. A trial that asks for it exits
  with code 5; a search fixes it to false.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import Dataset

if TYPE_CHECKING:
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
    def __init__(self, seq_len: int, vocab: int = VOCAB, d_model: int = D_MODEL, n_layers: int = N_LAYERS,
                 n_heads: int = N_HEADS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(n_layers))
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

    def __init__(self, cfg: TrialConfig) -> None:
        self.seq_len = cfg.image_size  # see the module docstring: the workload's size knob is the context length
        self.seed = cfg.seed
        self.stages = tuple(f"layers.{i}" for i in range(N_LAYERS))

    def build_model(self) -> nn.Module:
        return TinyLM(self.seq_len)

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
