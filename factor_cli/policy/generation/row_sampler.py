"""Per-reply random streams for seeded sampling: a reply does not depend on its batch.

The rollout runner seeds every reply (episode seed, turn, sample), and both backends must draw
reply i from its own stream so that batching, row order, duplicate-row merging and forced-token
skipping change no reply. Here a stream is a ``torch.Generator`` per row, consumed one
vocabulary-sized uniform vector per position (drawn or skipped), Gumbel-max over the scaled
logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RowSeededSampler:
    """Samples row i of a batch from softmax(z_i / T) with row i's own random stream.

    Gumbel-max: y_i = argmax_v (z_iv / T + g_iv), g_iv = -log(-log u_iv), u_iv ~ U(0, 1) drawn
    from a generator seeded with ``seeds[i]``; y_i is then exactly a draw from softmax(z_i / T).
    Each call consumes one vocabulary-sized draw per row, so row i's k-th token depends only on
    (seeds[i], k) and its logits.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, device: torch.device) -> None:
        self.temperature = temperature
        self.generators = [
            torch.Generator(device=device).manual_seed(int(s) % 2**63) for s in seeds
        ]
        self.skipped = [0] * len(seeds)
        """Per stream, draws owed to positions skipped since its last draw (:meth:`skip`)."""

    def draw(self, scores: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """The sampled token id of each row of ``scores`` [A, V], [A]; ``rows``: the streams
        (indices into ``seeds``) of those rows, all of them in order when None."""
        vocab = scores.shape[-1]
        rows = range(len(self.generators)) if rows is None else rows
        gens = [self.generators[r] for r in rows]
        for r, g in zip(rows, gens):
            for _ in range(self.skipped[r]):
                torch.rand(vocab, generator=g, device=scores.device)
            self.skipped[r] = 0
        u = torch.stack([torch.rand(vocab, generator=g, device=scores.device) for g in gens])
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        return (scores.float() / self.temperature + gumbel).argmax(-1)

    def skip(self, rows: Sequence[int], n: int) -> None:
        """The streams of ``rows`` past ``n`` more positions whose token was forced: their
        draws are made (and dropped) by the row's next :meth:`draw`, which knows the
        vocabulary size, so the k-th drawn token still uses the stream's k-th draw."""
        for r in rows:
            self.skipped[r] += n
