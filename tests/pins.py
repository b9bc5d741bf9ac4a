"""Tolerances of pinned numbers across CPUs, and a comparison that reports every mismatch.

A pinned float was computed on one machine in float32; another CPU (another vector width,
another BLAS path, another thread count) sums the same terms in another order and differs in
the last bits. How far is set by the arithmetic, not by taste. Following the probabilistic
rounding-error bound of Higham & Mary (2019), a reduction of n float32 terms is off by about
lambda * sqrt(n) * u relative to the sum of their magnitudes (u the unit roundoff, lambda a
small constant; the worst case n * u is never approached). A quantity computed through D such
reductions in a row (the model's layers, then the loss) accumulates D of them:

    gamma = LAMBDA * D * sqrt(R) * eps_32         R: the longest reduction (vocabulary, widths,
                                                     tokens of the batch), D: layers + 2

Each metric is then compared within

    |pinned - got| <= atol + gamma * max(|pinned|, |got|)

with an ``atol`` from the magnitudes it is computed from (:data:`ABSOLUTE`). A metric that is
zero in exact arithmetic (``approx_kl`` of the first pass: the policy is the behaviour policy;
the action loss of mean-zero credit at ratio 1; |w-bar_t - 1| under a mean-preserving
allocation) is rounding noise, so its atol is gamma times the scale of its terms, not 1e-9. A
weight digest (a sum over ~10^6 parameters, each within gamma of its pinned value) is compared
within gamma times the sum of magnitudes. Counts, outcome rates and schedule values (computed
in Python's float64 from discrete results) must be equal: if they differ, the step played
something else. A metric in neither class is an error, so a new metric must be classified.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

EPS32 = 2.0**-23
"""float32 machine epsilon (torch.finfo(torch.float32).eps)."""
LAMBDA = 4.0
"""The probabilistic bound's constant: lambda = 4 bounds a reduction's error with probability
>= 1 - 2 exp(-lambda^2 / 2) ~ 0.9993 per reduction under independent roundings."""

Scales = Mapping[str, float]
"""A step's magnitudes: ``logp`` max |log pi_old| of its action tokens, ``adv`` max |C_{t,j}|
and |A^seq_i|, ``weight`` max |omega_{t,j}|, ``kl_coef`` lambda_k."""


def gamma(reduction: int, depth: int) -> float:
    """The relative tolerance of a quantity computed through ``depth`` reductions of at most
    ``reduction`` terms (module docstring)."""
    return LAMBDA * depth * math.sqrt(reduction) * EPS32


def _surrogate(s: Scales) -> float:
    # C_{t,j} * exp(log pi - log pi_old): the ratio carries the log-probs' error.
    return s["adv"] * (1.0 + s["logp"])


ABSOLUTE: dict[str, Callable[[Scales], float]] = {
    "approx_kl": lambda s: s["logp"],  # mean(log pi_old - log pi)
    "kl": lambda s: s["logp"],  # sum_v p_v (log p_v - log q_v), p summing to 1
    "loss_action": _surrogate,
    "loss_non_action": _surrogate,
    "loss": lambda s: 2 * _surrogate(s) + s["kl_coef"] * s["logp"],  # the three terms' sum
    "coef_deviation_mean": lambda s: s["weight"] * (1.0 + s["logp"]),  # |mean_j omega - 1|
    "coef_deviation_median": lambda s: s["weight"] * (1.0 + s["logp"]),
}
"""Per metric: the magnitude whose gamma-multiple is its absolute tolerance."""
RELATIVE = frozenset({"grad_norm", "value_mse", "value_target_mse"})
"""Metrics of the model's outputs or gradients: relative tolerance gamma alone."""
EXACT = frozenset({
    "action_tokens", "actions", "clip_fraction", "continuation_interactions", "episodes_lost",
    "group_signal", "invalid_rate", "kl_coef", "replay_steps", "return_mean", "root_interactions",
    "strength", "success_rate", "td_sign_agreement", "turns_mean", "warmup", "zero_credit_share",
})  # fmt: skip
"""Counts, shares of discrete outcomes and schedule values: equal or the step played otherwise."""


def _within(pinned: float, got: float, atol: float, rtol: float) -> bool:
    return abs(pinned - got) <= atol + rtol * max(abs(pinned), abs(got))


def metric_mismatches(
    where: str, pinned: Mapping[str, float], got: Mapping[str, float], scales: Scales, g: float
) -> list[str]:
    """One line per metric of a step outside its tolerance (or missing, or unclassified)."""
    out = []
    for name in sorted(set(pinned) | set(got)):
        if name not in pinned or name not in got:
            out.append(f"{where}.{name}: only in the {'pins' if name in pinned else 'run'}")
            continue
        a, b = pinned[name], got[name]
        if name in EXACT:
            ok, tol = a == b, 0.0
        elif name in RELATIVE or name in ABSOLUTE:
            atol = g * ABSOLUTE[name](scales) if name in ABSOLUTE else 0.0
            tol = atol + g * max(abs(a), abs(b))
            ok = _within(a, b, atol, g)
        else:
            out.append(f"{where}.{name}: unclassified; add it to EXACT, RELATIVE or ABSOLUTE")
            continue
        if not ok:
            out.append(f"{where}.{name}: pinned {a!r}, got {b!r} (|diff| {abs(a - b):.3g} > "
                       f"tolerance {tol:.3g})")  # fmt: skip
    return out


def digest_mismatches(
    where: str, pinned: Mapping[str, float], got: Mapping[str, float], g: float
) -> list[str]:
    """A weight digest (``sum``, ``abs_sum``): each within gamma times the pinned abs_sum."""
    tol = g * max(pinned["abs_sum"], got["abs_sum"])
    return [
        f"{where}.{k}: pinned {pinned[k]!r}, got {got[k]!r} (|diff| "
        f"{abs(pinned[k] - got[k]):.3g} > tolerance {tol:.3g})"
        for k in ("sum", "abs_sum")
        if abs(pinned[k] - got[k]) > tol
    ]


def case_mismatches(where: str, pinned: dict, got: dict) -> list[str]:
    """Every mismatch of one pinned case: its ``reduction`` and ``depth`` (exact), each step's
    ``scales`` (relative gamma) and ``metrics``, and each digest."""
    if sorted(pinned) != sorted(got):
        return [f"{where}: parts differ: pinned {sorted(pinned)}, run {sorted(got)}"]
    out = [f"{where}.{k}: pinned {pinned[k]}, got {got[k]}"
           for k in ("reduction", "depth") if pinned[k] != got[k]]  # fmt: skip
    g = gamma(max(pinned["reduction"], got["reduction"]), pinned["depth"])
    if len(pinned["metrics"]) != len(got["metrics"]):
        return [*out, f"{where}: {len(pinned['metrics'])} pinned steps, {len(got['metrics'])} run"]
    for i, (sa, sb, ma, mb) in enumerate(
        zip(pinned["scales"], got["scales"], pinned["metrics"], got["metrics"])
    ):
        scales = {k: max(abs(sa[k]), abs(sb[k])) for k in sa}
        out += [f"{where}.scales[{i}].{k}: pinned {sa[k]!r}, got {sb[k]!r}"
                for k in sa if not _within(sa[k], sb[k], 0.0, g)]  # fmt: skip
        out += metric_mismatches(f"{where}.metrics[{i}]", ma, mb, scales, g)
    for part in ("policy", "value_online", "value_target"):
        if part in pinned:
            out += digest_mismatches(f"{where}.{part}", pinned[part], got[part], g)
    return out
