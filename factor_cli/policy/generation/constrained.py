"""Valid-action decoding: replies constrained to the current admissible actions by a token trie.

Reply i must be one of the token sequences

    R(a) = tokenize("<action>" + a + "</action>") [+ s],    a in A_i,

the whole reply string tokenized at once (so an action is written the way the tokenizer writes
that string), followed by a stop token s (eos) when ``</action>`` is not itself one (in the tiny
tokenizer it is a single stop token, see :func:`~.base.stop_token_ids`), so every reply ends by
stopping. The :class:`TokenTrie` of {R(a)} gives, after a reply prefix y_<j, the set C_j of
tokens that continue some R(a). The constrained policy is

    pi^C(y_j | x, y_<j) = exp(z_j[y_j] / T) / sum_{v in C_j} exp(z_j[v] / T),   y_j in C_j,

softmax(z_j / T) renormalised over C_j (greedy decoding: argmax over C_j, scored at T = 1).
Both backends sample from pi^C and report log pi^C, so a forced position (|C_j| = 1: the
``<action>`` tag, the rest of the only action with a given prefix, the closing tag) has log-prob
exactly 0. :attr:`~.base.Generation.allowed_ids` records C_j per position; the trainer
re-scores pi_theta under the same sets (:func:`constrained_logits`, used by
:func:`~.scoring.score_replies`), so the PPO ratio q = pi^C_theta / pi^C_old compares like with
like and is exactly 1 at the behaviour weights.

Rows without admissible actions (None or empty) decode freely. The mask only removes tokens, so the
per-reply random streams (:class:`~.row_sampler.RowSeededSampler`, vLLM's per-request generators)
draw exactly as in free decoding: the same seed gives the same reply, and a free row of a mixed
batch is the reply it would be alone.

Pure torch (no transformers, no vLLM): the HF backend's decode loop masks each step's logits to
C_j (:mod:`.decode`); the vLLM backend ships each request's token sequences to its engine, which
rebuilds the trie there (``vllm.TrieLogitsProcessor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..prompting import ACTION_CLOSE, ACTION_OPEN

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MASKED_LOGIT = -1e30
"""What :func:`constrained_logits` writes for a disallowed token: exp() of it is 0 as for -inf,
but finite, so a KL between two masked distributions is 0 (not 0 * inf = nan) off the set."""

Allowed = Sequence[Sequence[str] | None] | None
"""``generate(allowed=)``: per prompt, its admissible actions (None or empty: free decoding)."""

_Node = dict[int, "_Node"]


class TokenTrie:
    """The token sequences of the allowed replies of one prompt, as a trie of token ids.

    A node's children are the tokens allowed next; a sequence ends at a leaf (it ends with a
    stop token, after which generation stops).
    """

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        if not sequences:
            raise ValueError("a token trie needs at least one sequence")
        self.root: _Node = {}
        for seq in sequences:
            node = self.root
            for tok in seq:
                node = node.setdefault(int(tok), {})
        self.sequences = [list(map(int, s)) for s in sequences]

    def node(self, prefix: Sequence[int]) -> _Node | None:
        """The node reached by ``prefix`` (None: the prefix left the trie)."""
        node: _Node | None = self.root
        for tok in prefix:
            node = node.get(int(tok)) if node is not None else None
            if node is None:
                return None
        return node

    def allowed(self, prefix: Sequence[int]) -> list[int] | None:
        """C_j after ``prefix``: the sorted next tokens; None when the prefix is complete (a
        leaf) or left the trie, where nothing is constrained any more."""
        node = self.node(prefix)
        return sorted(node) if node else None

    def forced(self, prefix: Sequence[int]) -> tuple[list[int], bool]:
        """The tokens forced after ``prefix`` (each position's C_j a single token), and whether
        they complete the reply (reach a leaf: the last one is a stop token). ([], False) when
        the prefix left the trie."""
        node = self.node(prefix)
        toks: list[int] = []
        while node is not None and len(node) == 1:
            ((tok, node),) = node.items()
            toks.append(tok)
        return toks, node is not None and not node

    def allowed_along(self, tokens: Sequence[int]) -> list[list[int]]:
        """C_j at every position j of a reply generated under the trie, [len(tokens)] lists.

        Raises:
            ValueError: a token is not among its position's children (the reply was not
                generated under this trie).
        """
        out, node = [], self.root
        for j, tok in enumerate(tokens):
            if int(tok) not in node:
                raise ValueError(
                    f"token {int(tok)} at reply position {j} is not allowed by the action trie "
                    f"(allowed: {sorted(node)[:8]}...)"
                )
            out.append(sorted(node))
            node = node[int(tok)]
        return out


def check_allowed(allowed: Allowed, n: int) -> list[list[str] | None]:
    """``allowed`` as one list of actions (or None: free) per prompt, checked.

    Raises:
        ValueError (one line): a length other than the number of prompts, a bare string instead
            of a list of actions, or an empty action.
    """
    if allowed is None:
        return [None] * n
    if isinstance(allowed, str) or len(allowed) != n:
        size = "a string" if isinstance(allowed, str) else f"{len(allowed)} entries"
        raise ValueError(
            f"allowed has {size} for {n} prompts: pass one list of admissible actions (or None "
            "for free decoding) per prompt"
        )
    rows: list[list[str] | None] = []
    for i, row in enumerate(allowed):
        if isinstance(row, str):
            raise ValueError(f"allowed[{i}] is the string {row!r}: pass a list of actions")
        acts = list(row or [])
        for a in acts:
            if not isinstance(a, str) or not a.strip():
                raise ValueError(
                    f"allowed[{i}] holds the action {a!r}: every admissible action needs text "
                    "(drop it, or pass None for free decoding)"
                )
        rows.append(acts or None)
    return rows


class TrieBuilder:
    """Builds each prompt's :class:`TokenTrie` from its admissible actions, caching R(a)."""

    _CACHE_LIMIT = 100_000

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_ids: Sequence[int]) -> None:
        if not stop_ids:
            raise ValueError(
                "valid-action decoding needs a stop token (the tokenizer has no eos and "
                f"{ACTION_CLOSE} is not a single token)"
            )
        self.tokenizer = tokenizer
        self.stop_ids = [int(s) for s in stop_ids]
        self._cache: dict[str, tuple[int, ...]] = {}

    def reply_tokens(self, action: str) -> tuple[int, ...]:
        """R(a): the reply's token ids, ending with a stop token."""
        ids = self._cache.get(action)
        if ids is not None:
            return ids
        text = f"{ACTION_OPEN}{action}{ACTION_CLOSE}"
        toks = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]
        if toks and toks[-1] not in self.stop_ids:
            toks.append(self.stop_ids[0])
        early = [t for t in toks[:-1] if t in self.stop_ids]
        if early:
            raise ValueError(
                f"the admissible action {action!r} contains the stop token {early[0]} "
                f"({self.tokenizer.decode([early[0]])!r}): generation would stop inside it"
            )
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[action] = ids = tuple(toks)
        return ids

    def sequences(self, actions: Sequence[str]) -> list[list[int]]:
        """The distinct R(a) of ``actions``, in first-seen order."""
        return [list(s) for s in dict.fromkeys(self.reply_tokens(a) for a in actions)]

    def tries(self, allowed: Allowed, n: int) -> list[TokenTrie | None]:
        """One trie per prompt (None: free decoding); ``allowed`` checked by
        :func:`check_allowed`."""
        return [
            None if acts is None else TokenTrie(self.sequences(acts))
            for acts in check_allowed(allowed, n)
        ]


def allowed_mask(
    allowed_ids: Sequence[Sequence[int]], vocab: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[G, V] bool: True where token v is in C_j of position j."""
    rows = [j for j, ids in enumerate(allowed_ids) for _ in ids]
    cols = [int(v) for ids in allowed_ids for v in ids]
    mask = torch.zeros((len(allowed_ids), vocab), dtype=torch.bool, device=device)
    mask[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)] = True
    return mask


def constrained_logits(
    logits: torch.Tensor, allowed_ids: Sequence[Sequence[int]], fill: float = MASKED_LOGIT
) -> torch.Tensor:
    """``logits`` [G, V] (already divided by T) with every token outside C_j set to ``fill``:
    log_softmax of the result is log pi^C (module docstring). Out of place, so gradient flows
    to the allowed entries only."""
    if len(allowed_ids) != logits.shape[0]:
        raise ValueError(
            f"allowed_ids has {len(allowed_ids)} positions for {logits.shape[0]} reply tokens"
        )
    keep = allowed_mask(allowed_ids, logits.shape[-1], logits.device)
    return logits.masked_fill(~keep, fill)
