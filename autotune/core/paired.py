"""What paired rounds can say of a speedup: each round measures a config and its reference side by side
(the baseline, or the script as written), and its figure is their ratio. On a machine whose speed moves
from process to process by ~10%, a median with no interval is a claim nobody can check.

The interval is the sign test's, for the median of the per-round ratios: the order statistics
[r_(k), r_(n+1-k)] hold the true median with probability 1 - 2 P(Binomial(n, 1/2) < k), whatever the
ratios' distribution (no normality, no independence of sides, only of rounds). It is chosen over a
bootstrap because it stays exact at the few rounds a budget pays for (a bootstrap of 3 ratios resamples
3 numbers). With 3-4 rounds the only interval is the rounds' range, and its coverage (75%, 87.5%) is
said with it; from 5 rounds it reaches 90%. A gain is claimed only with at least MIN_ROUNDS rounds and an
interval that excludes x1.00: fewer rounds, or an interval that holds it, is "no measurable gain". Below
CONFIDENCE (3-4 rounds) the interval must also clear the reference's own spread in the same rounds
(`noise`: its highest figure over its median): on a machine whose processes run 25% apart, three rounds
"confirmed" a set_to_none change at x1.46 (x1.06..x1.46) that ran alone at x0.93, beside a baseline whose
own rounds spread x0.98..x1.34.

May import: nothing of autotune (pure arithmetic, used by the search, the export and `autotune train`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from math import comb

MIN_ROUNDS = 3  # below this no export changes anything: two rounds "faster in every round" came out x1.07
CONFIDENCE = 0.90  # the interval's target coverage, reached from 5 rounds


def spread(figures: Sequence[float]) -> tuple[float, float]:
    """The lowest and the highest of one config's figures over their median: its run-to-run noise."""
    mid = statistics.median(figures)
    return min(figures) / mid, max(figures) / mid


def coverage(n: int, k: int) -> float:
    """P(r_(k) <= median <= r_(n+1-k)) for n ratios: 1 - 2 P(Binomial(n, 1/2) < k)."""
    return 1.0 - 2.0 * sum(comb(n, i) for i in range(k)) / 2.0**n


@dataclass(frozen=True)
class Paired:
    """Per-round ratios (config / reference, same round) and what they say."""

    ratios: tuple[float, ...]
    noise: float = 1.0  # the reference's own spread in the same rounds (its highest figure over its median)

    @classmethod
    def of(cls, ratios: Sequence[float], noise: float | None = None) -> Paired:
        return cls(tuple(float(r) for r in ratios), max(1.0, float(noise or 1.0)))

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Paired:
        """A stored row's rounds (a confirmation's, an alone record's): its ratios and the noise beside them."""
        return cls.of(row.get("ratios") or (), row.get("noise"))

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def depth(self) -> int:
        """k: the widest-kept order statistic whose interval reaches CONFIDENCE (1, the range, when none does)."""
        n = self.rounds
        k = 1
        while k + 1 <= (n + 1) // 2 and coverage(n, k + 1) >= CONFIDENCE:
            k += 1
        return k

    @property
    def interval(self) -> tuple[float, float]:
        s = sorted(self.ratios)
        return s[self.depth - 1], s[self.rounds - self.depth]

    @property
    def coverage(self) -> float:
        return coverage(self.rounds, self.depth) if self.rounds else 0.0

    @property
    def direction(self) -> str | None:
        """'faster' or 'slower' when the rounds say so (enough rounds, an interval clear of x1.00); else None."""
        if self.rounds < MIN_ROUNDS:
            return None
        low, high = self.interval
        floor = self.noise if self.coverage < CONFIDENCE else 1.0  # thin rounds must clear the noise too
        return "faster" if low > floor else "slower" if high < 1.0 else None

    @property
    def measurable(self) -> bool:
        return self.direction == "faster"

    def figure(self) -> str:
        """'x1.12 (x1.04..x1.19, 88% sign-test interval, 4 rounds)'."""
        low, high = self.interval
        return (
            f"x{self.median:.2f} (x{low:.2f}..x{high:.2f}, {self.coverage:.0%} sign-test interval, "
            f"{self.rounds} round{'s' if self.rounds != 1 else ''})"
        )

    def statement(self, than: str = "the baseline") -> str:
        """One line: the verdict, then the figure it rests on."""
        if not self.ratios:
            return "no paired round measured"
        if self.rounds < MIN_ROUNDS:
            return f"no measurable gain yet: {self.figure()}; at least {MIN_ROUNDS} paired rounds decide"
        if self.direction is None:
            low = self.interval[0]
            if 1.0 < low <= self.noise and self.coverage < CONFIDENCE:
                return (
                    f"no measurable gain over {than} on this machine: {self.figure()} does not clear "
                    f"{than}'s own spread in the same rounds (x{self.noise:.2f}); more rounds decide"
                )
            return f"no measurable gain over {than} on this machine: {self.figure()} holds x1.00"
        return f"{self.direction} than {than}: {self.figure()}"

    def to_dict(self) -> dict[str, object]:
        low, high = self.interval if self.ratios else (None, None)
        return {
            "rounds": self.rounds,
            "ratios": list(self.ratios),
            "median": self.median if self.ratios else None,
            "interval": [low, high],
            "coverage": self.coverage,
            "verdict": self.statement(),
            "measurable": self.measurable,
            "noise": self.noise,
        }
