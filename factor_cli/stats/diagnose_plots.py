"""One PNG per ``factor diagnose`` kind, from the tables of :mod:`factor_cli.stats.diagnose`
(matplotlib's object API on the Agg canvas, as :mod:`factor_cli.stats.plots`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from .diagnose import by
from .plots import _figure, _save


def _finish(
    ax: Axes, xlabel: str, ylabel: str, title: str, out: Path, legend_size: int | None = None
) -> Path:
    """Label the axes, title and legend, and write the figure to ``out``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    return _save(ax.figure, out)


def _bars(table: pd.DataFrame, x: str, ys: list[str], title: str, ylabel: str, out: Path) -> Path:
    """Grouped bars of columns ``ys`` per value of ``x``, one panel per method side by side."""
    methods = list(dict.fromkeys(table["method"]))
    _, ax = _figure(6.4 + 1.2 * max(len(methods) - 1, 0), 4.0)
    labels = [f"{m}\n{v}" for m, v in zip(table["method"], table[x])]
    pos = np.arange(len(table))
    width = 0.8 / len(ys)
    for i, y in enumerate(ys):
        ax.bar(pos + (i - (len(ys) - 1) / 2) * width, table[y].to_numpy(float), width, label=y)
    ax.set_xticks(pos, labels, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(ys) > 1:
        ax.legend()
    return _save(ax.figure, out)


def coef_deviation_plot(actions: pd.DataFrame, out: Path) -> Path:
    """Histogram of |w-bar_t - 1| per method (log-spaced bins; 0 drawn at the left edge)."""
    _, ax = _figure()
    floor = 1e-8
    for method, g in actions.groupby("method"):
        dev = np.maximum((g["wbar"] - 1.0).abs().to_numpy(), floor)
        ax.hist(dev, bins=np.logspace(-8, 1, 46), histtype="step", label=str(method))
    ax.set_xscale("log")
    ax.axvline(0.10, color="grey", linestyle="--", linewidth=0.8)
    return _finish(
        ax,
        "|mean multiplier - 1| per action (values below 1e-8 drawn at 1e-8)",
        "actions",
        "Coefficient deviation (paper Fig. 5A)",
        out,
    )


def group_signal_plot(table: pd.DataFrame, out: Path) -> Path:
    _, ax = _figure()
    for method, g in table.groupby("method"):
        ax.plot(g["step"], g["group_signal"], marker="o", label=f"{method}: groups with signal")
        ax.plot(g["step"], g["zero_credit"], linestyle="--", label=f"{method}: zero-credit actions")
    ax.set_ylim(-0.02, 1.02)
    return _finish(ax, "training step", "share", "The signal RL gets", out, legend_size=7)


def value_plot(curve: pd.DataFrame, out: Path) -> Path:
    _, ax = _figure()
    lo = float(min(curve["prediction"].min(), curve["target"].min(), 0.0))
    hi = float(max(curve["prediction"].max(), curve["target"].max(), 1.0))
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="calibrated")
    for method, g in curve.groupby("method"):
        ax.plot(g["prediction"], g["target"], marker="o", label=str(method))
    return _finish(
        ax,
        "V_target(x_t), bin mean",
        "continuation return, bin mean",
        "Value-head reliability (paper Table 17)",
        out,
    )


def length_bias_plot(table: pd.DataFrame, out: Path) -> Path:
    return _bars(
        table, "bucket", ["token_mean", "action_mean"],
        "Surrogate weight by action length (paper Table 24)", "mean weight", out,
    )  # fmt: skip


def horizon_plot(table: pd.DataFrame, out: Path) -> Path:
    return _bars(
        table, "bucket", ["success"],
        "Success by trajectory length in actions (paper Table 26)", "success rate", out,
    )  # fmt: skip


def td_sign_plot(estimates: pd.DataFrame, out: Path) -> Path:
    """Credit A_t against the Monte-Carlo advantage, one marker per method and phase (Fig. 5B)."""
    _, ax = _figure()
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.axvline(0.0, color="grey", linewidth=0.8)
    markers = iter("os^vDP*X")
    for (method, phase), g in estimates.groupby(["method", "phase"], sort=True):
        ax.scatter(g["mc"], g["credit"], s=10, alpha=0.6, marker=next(markers, "o"),
                   label=f"{method}, {phase}")  # fmt: skip
    return _finish(
        ax,
        "Monte-Carlo advantage: mean G from x_{t+1} - mean G from x_t",
        "credit A_t",
        "Credit against an independent Monte-Carlo estimate (paper Fig. 5B)",
        out,
        legend_size=7,
    )


def agreement_plot(table: pd.DataFrame, out: Path) -> Path:
    """Per method, a matrix of the estimators' pairwise sign agreement (upper triangle) and
    Spearman correlation (lower triangle)."""
    methods = list(dict.fromkeys(table["method"])) or ["(none)"]
    fig, _ = _figure(4.2 * len(methods), 4.0)
    fig.clear()
    axes = fig.subplots(1, len(methods), squeeze=False)[0]
    image = None
    for ax, method in zip(axes, methods):
        part = table[table["method"] == method]
        names = list(dict.fromkeys([*part["estimator_a"], *part["estimator_b"]]))
        grid = np.full((len(names), len(names)), np.nan)
        for row in part.itertuples(index=False):
            i, j = names.index(row.estimator_a), names.index(row.estimator_b)
            grid[i, j], grid[j, i] = row.sign_agree, row.spearman
        image = ax.imshow(grid, vmin=-1, vmax=1, cmap="RdBu")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=45, fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_title(f"{method} runs: sign agreement (upper), Spearman (lower)", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=list(axes))
    return _save(fig, out)


def feedback_plot(table: pd.DataFrame, out: Path) -> Path:
    """Top-quartile mass of the allocation per feedback condition and method, beside the
    uniform allocation's."""
    return _bars(table, "condition", ["top_mass", "uniform_top_mass"],
                 "Allocation concentration by teacher feedback (paper Table 27)",
                 "share of rho on the top quarter of tokens", out)  # fmt: skip


def token_perturb_plot(table: pd.DataFrame, out: Path) -> Path:
    """Mean return change from perturbing the top vs the bottom quartile of rho, per method and
    credit sign."""
    return _bars(table, "sign", ["delta_top", "delta_bottom"],
                 "Return change from perturbing allocation quartiles (paper Fig. 5C)",
                 "mean Delta G", out)  # fmt: skip


def _position_x(label: str) -> float:
    """x of a position of :func:`~factor_cli.stats.diagnose.credit_by_position`: turn t at t,
    '>=K' at K; 'last' is placed by the caller."""
    return float(label[2:] if label.startswith(">=") else label)


def position_plot(table: pd.DataFrame, out: Path) -> Path:
    """Mean credit share A*_t / A^seq_i by turn, one panel per result (success, failure): per
    method (and env), a line with its 95% band over the turns, the 'last' action apart on the
    right with its interval, and a dotted line of the same colour at the mean 1 / T_i, what
    uniform credit would give. Above 0, an action moves with the outcome; below, against it."""
    fig, _ = _figure(10.0, 4.0)
    fig.clear()
    axes = fig.subplots(1, 2, sharey=True)
    series = by(table)
    turns = table[table["position"] != "last"]
    edge = max((_position_x(p) for p in turns["position"]), default=0.0)
    keys = [k for k, _ in table.groupby(series, sort=True)]  # one colour a series, both panels
    for ax, result in zip(axes, ("success", "failure")):
        ax.axhline(0.0, color="grey", linewidth=0.8)
        part = table[table["result"] == result]
        for key, g in part.groupby(series, sort=True):
            label = ", ".join(map(str, key if isinstance(key, tuple) else (key,)))
            color = f"C{keys.index(key) % 10}"
            line = g[g["position"] != "last"].assign(x=lambda f: f["position"].map(_position_x))
            line = line.sort_values("x")
            ax.plot(line["x"], line["share"], marker="o", color=color, label=label)
            ax.fill_between(line["x"], line["share_low"], line["share_high"], color=color,
                            alpha=0.2, linewidth=0)  # fmt: skip
            ax.plot(line["x"], line["uniform_share"], linestyle=":", color=color)
            last = g[(g["position"] == "last") & g["share"].notna()]
            for row in last.itertuples(index=False):
                # A percentile interval need not contain the mean: clip the bar at it.
                err = np.maximum([[row.share - row.share_low], [row.share_high - row.share]], 0)
                ax.errorbar([edge + 1.5], [row.share], yerr=err, fmt="s", color=color, capsize=3)
        ticks = {_position_x(p): p for p in turns["position"]}
        ax.set_xticks([*ticks, edge + 1.5], [*ticks.values(), "last"])
        ax.set_xlabel("turn t (0-based)")
        ax.set_title(f"{result}: mean A*_t / A^seq (dotted: 1/T_i, uniform credit)", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("mean credit share, 95% CI over trajectories")
    return _save(fig, out)
