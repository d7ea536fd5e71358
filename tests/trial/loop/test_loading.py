"""autotune/trial/loop/loading.py: the loader knobs reach the DataLoader, and the samplers keep the data order
(and each sample's augmentations) whatever the workers, the micro-batch or the ranks."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler, TensorDataset

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.trial.loop import harness, loading

CPU = torch.device("cpu")


def dataset(n: int = 16) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3, 8, 8), torch.rand(n, 1, 8, 8))


# --- DataLoader knobs -----------------------------------------------------------------------------


def test_loader_gets_worker_knobs() -> None:
    cfg = TrialConfig(num_workers=2, persistent_workers=True, prefetch_factor=3, batch_size=4, pin_memory=True)
    loader, applied = loading.build_loader(dataset(), cfg, rank=0, world=1, device=CPU)
    assert loader.num_workers == 2
    assert loader.persistent_workers is True
    assert loader.prefetch_factor == 3
    assert loader.batch_size == 4 and not loader.drop_last  # training (epoch-sized) sees every sample
    assert isinstance(loader.sampler, RandomSampler)
    assert applied["num_workers"] == {"requested": 2, "in_effect": 2}
    assert applied["persistent_workers"] == {"requested": True, "in_effect": True}
    assert applied["prefetch_factor"] == {"requested": 3, "in_effect": 3}
    assert applied["batch_size"] == {"requested": 4, "in_effect": 4}


def test_pin_memory_requested_but_not_in_effect_on_cpu() -> None:
    loader, applied = loading.build_loader(dataset(), TrialConfig(pin_memory=True), 0, 1, CPU)
    assert loader.pin_memory is False  # pinning needs a CUDA device to pin for
    rec = applied["pin_memory"]
    assert rec["requested"] is True and rec["in_effect"] is False and "CUDA" in rec["why"]


def test_loader_without_workers_has_no_prefetch() -> None:
    loader, applied = loading.build_loader(dataset(), TrialConfig(batch_size=4), 0, 1, CPU)
    assert loader.num_workers == 0 and loader.prefetch_factor is None
    assert applied["prefetch_factor"] == {"requested": None, "in_effect": None}
    assert applied["pin_memory"] == {"requested": False, "in_effect": False}
    x, y = next(iter(loader))
    assert x.shape == (4, 3, 8, 8) and y.shape == (4, 1, 8, 8)


def test_default_prefetch_with_workers_is_torch_default() -> None:
    loader, applied = loading.build_loader(dataset(), TrialConfig(num_workers=1), 0, 1, CPU)
    assert loader.prefetch_factor == 2 and applied["prefetch_factor"] == {"requested": None, "in_effect": 2}


def test_loader_shards_across_ranks() -> None:
    loader, _ = loading.build_loader(dataset(16), TrialConfig(batch_size=2, seed=3), rank=1, world=2, device=CPU)
    assert isinstance(loader.sampler, DistributedSampler)
    assert loader.sampler.num_replicas == 2 and loader.sampler.rank == 1 and loader.sampler.seed == 3
    assert len(loader) == 4  # 16 samples / 2 ranks / batch 2


def test_loader_refuses_a_dataset_smaller_than_the_processes() -> None:
    # Epoch-sized (`autotune train`): a process with an empty shard would have nothing to train on.
    with pytest.raises(ConfigError, match="fewer than the 2 processes"):
        loading.build_loader(dataset(1), TrialConfig(batch_size=4), 0, 2, CPU)


def test_training_loader_keeps_the_partial_last_batch() -> None:
    loader, _ = loading.build_loader(dataset(6), TrialConfig(batch_size=4), 0, 1, CPU)
    assert [len(x) for x, _ in loader] == [4, 2]  # every sample, every epoch: no partial batch dropped


def test_endless_loader_batches_are_always_whole() -> None:
    loader, _ = loading.build_loader(dataset(6), TrialConfig(batch_size=4), 0, 1, CPU, endless=True)
    assert loader.drop_last and all(len(x) == 4 for x, _ in itertools.islice(loader, 5))


# --- the endless sampler (trials) -----------------------------------------------------------------


def test_endless_loader_is_one_iterator_across_epochs() -> None:
    from tests.trial.cuda_fault_pipelines import WorkerPid

    def five_batches(endless: bool) -> tuple[list[int], set[int]]:
        loader, _ = loading.build_loader(WorkerPid(6), TrialConfig(batch_size=4, num_workers=1), 0, 1, CPU, endless)
        stream = harness.batches(loader)
        got = [next(stream) for _ in range(5)]
        return torch.cat([i for i, _ in got]).tolist(), {pid for _, pids in got for pid in pids.tolist()}

    items, pids = five_batches(endless=True)  # 20 items from a dataset of 6: over three epochs
    assert len(pids) == 1, pids  # the one worker served every epoch: the loader never restarted
    for e in range(3):
        assert sorted(items[6 * e : 6 * e + 6]) == list(range(6))  # each epoch is a whole permutation
    _, restarted = five_batches(endless=False)  # the epoch-sized loader (4 + 2 per epoch): a new worker each epoch
    assert len(restarted) == 3


def test_endless_loader_takes_a_batch_larger_than_the_dataset() -> None:
    loader, applied = loading.build_loader(dataset(6), TrialConfig(batch_size=8, seed=2), 0, 1, CPU, endless=True)
    x, _ = next(harness.batches(loader))
    assert x.shape[0] == 8
    assert applied["sampler"]["in_effect"] == "EndlessShuffle(seed=2)"


@pytest.mark.parametrize("n", [6, 7])
def test_endless_shards_are_disjoint_and_match_distributed_sampler(n: int) -> None:
    ranks = [loading.EndlessShuffle(n, seed=5, rank=r, world=2) for r in range(2)]
    for e in range(3):
        shards = [s.epoch(e) for s in ranks]
        assert not set(shards[0]) & set(shards[1]) and len(shards[0]) == len(shards[1]) == n // 2
        for r, shard in enumerate(shards):
            ref = DistributedSampler(range(n), num_replicas=2, rank=r, shuffle=True, seed=5, drop_last=True)
            ref.set_epoch(e)
            assert shard == list(ref)
    # The stream is the epochs one after the other.
    it = iter(ranks[1])
    assert [next(it) for _ in range(3 * (n // 2))] == sum((ranks[1].epoch(e) for e in range(3)), [])


@pytest.mark.parametrize("n, world, words", [(3, 4, "3 samples, fewer than the 4 ranks"), (0, 1, "0 samples;")])
def test_endless_shuffle_refuses_an_empty_shard(n: int, world: int, words: str) -> None:
    # It would spin forever without yielding an index.
    with pytest.raises(ConfigError, match=words):
        loading.EndlessShuffle(n, seed=0, rank=0, world=world)


class Augmented(torch.utils.data.Dataset):
    """Every item draws a random "augmentation" from torch's global generator, as torchvision's do."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([float(i)]), torch.rand(1)


def test_augmentations_do_not_depend_on_workers_or_micro_batch() -> None:
    def draws(workers: int, batch: int) -> dict[float, list[float]]:
        cfg = TrialConfig(num_workers=workers, batch_size=batch, seed=3)
        loader, _ = loading.build_loader(harness.checked(Augmented()), cfg, 0, 1, CPU, endless=True)
        out: dict[float, list[float]] = {}
        for x, r in itertools.islice(loader, 24 // batch):  # two epochs
            for i, v in zip(x.flatten().tolist(), r.flatten().tolist()):
                out.setdefault(i, []).append(v)
        return out

    plain = draws(0, 4)
    assert draws(2, 4) == plain and draws(0, 2) == plain  # the same draw per sample and epoch
    assert all(a != b for a, b in plain.values())  # a new draw each epoch
    before = torch.get_rng_state()
    item = harness.checked(Augmented())[(0, 5)]
    assert torch.equal(torch.get_rng_state(), before)  # the model's generator is left as it was
    assert torch.equal(item[1], harness.checked(Augmented())[(0, 5)][1])  # its draw is the seed's


def test_training_epochs_draw_the_same_augmentations_with_or_without_workers() -> None:
    def epochs(workers: int) -> list[dict[float, float]]:
        cfg = TrialConfig(num_workers=workers, batch_size=5, seed=3)
        loader, _ = loading.build_loader(harness.checked(Augmented()), cfg, 0, 1, CPU)
        out = []
        for e in range(2):
            loader.sampler.set_epoch(e)
            out.append({i: v for x, r in loader for i, v in zip(x.flatten().tolist(), r.flatten().tolist())})
        return out

    plain = epochs(0)
    assert len(plain[0]) == 12 and epochs(2) == plain  # every sample, and its draw, whoever loads it
    assert plain[0] != plain[1]  # a new draw per epoch
