"""Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class Sampler:
    """How the next token is chosen (transformers' ``generate`` arguments of the same names).

    ``do_sample`` False: the arg max (the first one on a tie, as torch's ``argmax``). True: a draw
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens (0: all)
    and then to the smallest set whose probability reaches ``top_p`` (1.0: all), from a
    ``numpy.random.Generator`` seeded with ``seed`` (same seed, same tokens).
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise InputError(f"temperature must be > 0, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise InputError(f"top_k must be an integer >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")

    def rng(self) -> np.random.Generator:
        """A fresh generator for one ``generate`` / ``stream`` call."""
        return np.random.default_rng(self.seed)

    def choose(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The next token of each row of ``logits`` [batch, vocab] (int64 [batch])."""
        if not self.do_sample:
            return np.argmax(logits, axis=-1).astype("int64")
        return np.array([self._draw(row, rng) for row in logits], dtype="int64")

    def _draw(self, row: np.ndarray, rng: np.random.Generator) -> int:
        z = row.astype("float64") / self.temperature
        order = np.argsort(-z, kind="stable")
        if self.top_k:
            order = order[: self.top_k]
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[rng.choice(len(order), p=p)])
