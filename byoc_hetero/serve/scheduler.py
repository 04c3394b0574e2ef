"""Continuous batching of token generation: one :class:`Scheduler` per generator model and replica.

The scheduler owns one KV cache of ``slots`` sequences (``Generator.new_cache(slots)``) and one thread
that loops over two kinds of step, built on :meth:`byoc_hetero.llm.Generator.step`:

- **admit**: while a slot is free and a request waits, its prompt is prefilled *alone* into its slot
  (a batch-1 step on :meth:`~byoc_hetero.llm.Generator.slot_cache`, views of that slot's rows), which
  writes nothing of the other slots; its first token is chosen and the request joins the decode batch;
- **decode**: one step of ``slots`` rows, ``S`` = 1, for every active request at once: each active slot
  feeds its last token after its own ``past``, a free slot feeds nothing (``lengths`` 0: its cache is not
  written). Each request then chooses its next token with its own sampler and random generator.

Requests join between decode steps (after their prefill) and leave when they finish (a stop token,
``max_tokens``, or :meth:`Scheduler.cancel`), freeing their slot for the next waiting request. The decode
step always has ``slots`` rows and a request's prefill always runs alone, so a request's logits, hence
its tokens (greedy, or sampled from its own seeded generator), do not depend on what else runs with it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
import numpy as np

from ..errors import InputError
from ..llm import Generator, Sampler

SLOTS = 8
"""Default number of sequences a scheduler decodes together (its cache's batch)."""


@dataclass(frozen=True)
class Event:
    """What a request hears from the scheduler: a new ``token`` (None with an error), and, on its last
    event, why it ended (``finish``: ``"stop"``, ``"length"``, ``"error"``; None before). ``batch``: the
    sequences of the step that made the token (1 for a prefill)."""

    token: int | None
    finish: str | None = None
    batch: int = 1
    error: str | None = None


@dataclass(eq=False)
class Sequence:
    """One request in the scheduler: its prompt (int64 ids), at most ``max_tokens`` new tokens, how they
    are chosen, the token ids that end it, and ``deliver``, called from the scheduler's thread with each
    :class:`Event`."""

    prompt: np.ndarray
    max_tokens: int
    sampler: Sampler
    stop_ids: frozenset[int]
    deliver: Callable[[Event], None]
    cancelled: bool = False
    generated: int = 0
    past: int = 0
    last: int = 0
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = self.sampler.rng()


class Scheduler:
    """Steps every active request of one generator together (module doc). Thread-safe: :meth:`submit`
    and :meth:`cancel` may be called from any thread; events are delivered from the scheduler's thread."""

    def __init__(self, generator: Generator, slots: int = SLOTS, name: str = "llm") -> None:
        if int(slots) != slots or slots < 1:
            raise InputError(f"slots must be an integer >= 1, got {slots!r}")
        self.generator, self.slots = generator, int(slots)
        self._cache = generator.new_cache(self.slots)
        self._active: dict[int, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        self._steps: list[int] = []  # sequences per decode step, until taken by :meth:`take_steps`
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"byoc-hetero-scheduler-{name}", daemon=True)
        self._thread.start()

    # ---- the callers' side ----------------------------------------------------------------------
    def check(self, prompt: Iterable[int], max_tokens: int) -> np.ndarray:
        """The prompt as int64 ids; InputError (the generator's text) if an id is outside the vocabulary,
        ``max_tokens`` is not >= 1, or prompt + ``max_tokens`` is longer than the cache."""
        if int(max_tokens) != max_tokens or max_tokens < 1:
            raise InputError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        rows, _ = self.generator._prompts([np.asarray(list(prompt), dtype="int64")])
        self.generator._check_room(rows, int(max_tokens))
        return rows[0]

    def submit(self, sequence: Sequence) -> Sequence:
        """Queue ``sequence`` (its prompt checked with :meth:`check` first) for the next admit step."""
        sequence.prompt = self.check(sequence.prompt, sequence.max_tokens)
        with self._cv:
            if self._closed:
                raise InputError("the scheduler is closed")
            self._waiting.append(sequence)
            self._cv.notify()
        return sequence

    def cancel(self, sequence: Sequence) -> None:
        """Stop generating for ``sequence`` (it leaves at the next step; no more events)."""
        sequence.cancelled = True

    def take_steps(self) -> list[int]:
        """The number of sequences of each decode step since the last call (for metrics)."""
        with self._cv:
            steps, self._steps = self._steps, []
        return steps

    def close(self) -> None:
        """End the thread once the requests in flight are done with."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=60)

    # ---- the scheduler's thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or self._waiting or self._active)
                if self._closed and not self._waiting and not self._active:
                    return
                self._active = {s: q for s, q in self._active.items() if not q.cancelled}
                admit = []
                while self._waiting and len(self._active) + len(admit) < self.slots:
                    seq = self._waiting.popleft()
                    if not seq.cancelled:
                        admit.append(seq)
            for seq in admit:
                self._admit(seq)
            if self._active:
                self._decode()

    def _free_slot(self) -> int:
        return min(set(range(self.slots)) - set(self._active))

    def _admit(self, seq: Sequence) -> None:
        """Prefill ``seq`` alone into a free slot, choose its first token; it joins unless it is done."""
        slot = self._free_slot()
        gen = self.generator
        try:
            logits = gen.step(seq.prompt[None], np.zeros(1, "int64"), np.array([seq.prompt.size]),
                              gen.slot_cache(self._cache, slot))
        except Exception as err:  # noqa: BLE001 - this request's failure, not the scheduler's
            seq.deliver(Event(None, "error", 1, f"{type(err).__name__}: {err}"))
            return
        seq.past = int(seq.prompt.size)
        if self._emit(seq, logits, 1):
            self._active[slot] = seq

    def _decode(self) -> None:
        """One step of every active sequence (``slots`` rows; free slots write nothing)."""
        tokens = np.zeros((self.slots, 1), "int64")
        past = np.zeros(self.slots, "int64")
        lengths = np.zeros(self.slots, "int64")
        for slot, seq in self._active.items():
            tokens[slot, 0], past[slot], lengths[slot] = seq.last, seq.past, 1
        batch = len(self._active)
        with self._cv:
            self._steps.append(batch)
        try:
            logits = self.generator.step(tokens, past, lengths, self._cache)
        except Exception as err:  # noqa: BLE001 - fail the step's requests, keep serving
            for seq in self._active.values():
                seq.deliver(Event(None, "error", batch, f"{type(err).__name__}: {err}"))
            self._active.clear()
            return
        for slot, seq in list(self._active.items()):
            seq.past += 1
            if seq.cancelled or not self._emit(seq, logits[slot:slot + 1], batch):
                del self._active[slot]

    def _emit(self, seq: Sequence, logits: np.ndarray, batch: int) -> bool:
        """Choose ``seq``'s next token from its logits [1, vocab] and deliver it; whether it goes on."""
        token = int(seq.sampler.choose(logits, seq.rng)[0])
        seq.generated += 1
        seq.last = token
        finish = "stop" if token in seq.stop_ids else "length" if seq.generated >= seq.max_tokens else None
        seq.deliver(Event(token, finish, batch))
        return finish is None and not seq.cancelled


__all__ = ["SLOTS", "Event", "Scheduler", "Sequence"]
