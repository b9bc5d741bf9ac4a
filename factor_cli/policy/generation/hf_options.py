"""The ``hf`` backend's optimisations as switches, with their defaults (``rollout.hf.*``).

Each is on by default and gives the same replies and log-probs as off (within float rounding;
each has its equivalence test against the plain path in ``tests/policy``); off is for
comparison and for isolating a problem. Light on purpose (no torch), so the training config
takes its defaults from here. What each one saves is measured in the benchmarks
(``docs/benchmarks.md``), not stated here.
"""

from __future__ import annotations

SHARED_PREFIX_MIN: int | None = 16
"""Cascade attention: a prefill or decode forward attends once to a stored prompt prefix shared
by every row of its batch (``shared_attention``) when it is at least this many tokens long (a
shorter one is not worth a second attention call); None: never. CPU only."""

STEM_MIN: int | None = 32
"""Shared stems: a prefix that two or more prompts of one batch share past what the cache holds
of them is prefilled once, first, when it is at least this many tokens longer than that (a
shorter one is not worth the extra forward); None: never."""

PREFIX_CACHE_BYTES = 1024**3
"""Default bound of the prefix cache's memory (KV bytes): 1 GiB, at most two full batches of
contexts (``2 * batch_size * max_context`` tokens); ``prefix_cache_tokens`` overrides it."""

MERGE_DUPLICATES = True
"""Duplicate rows: requests of a seeded or greedy batch with the same prompt decode in one row
while their replies agree (False: a row per request)."""

SKIP_FORCED = True
"""Forced tokens: under valid-action decoding, tokens a reply's trie forces skip the model
where no logits of theirs are read (False: one forward per token)."""

OPTION_NAMES = (
    "prefix_cache_tokens", "shared_prefix_min", "stem_min", "merge_duplicates", "skip_forced",
)  # fmt: skip
"""The hf backend's options (:func:`.backends.hf_backend`), each a ``rollout.hf`` field."""
