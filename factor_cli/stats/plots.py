"""Figures written as PNG files: training curves with seed bands, ablation deltas, the bootstrap
distribution and performance profiles.

Only matplotlib's object API with the Agg canvas is used (no pyplot, no global backend state),
so plotting works without a display and does not change the backend of a caller's session.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

BANDS: tuple[str, ...] = ("std", "minmax", "none")
_DPI = 150


def _figure(width: float = 6.4, height: float = 4.0) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise ValueError(f"plots are written as PNG; give an output path ending in .png, not {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=_DPI)
    return out


def seed_band(curves: np.ndarray, band: str = "std") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean curve and band over seeds.

    Args:
        curves: y[seed, step], shape [S, T]; NaN where a seed has no value at a step.
        band: ``"std"`` (mean ± sample std, needs S >= 2 at a step), ``"minmax"`` or ``"none"``.

    Returns:
        (mean[T], low[T], high[T]); low = high = mean where the band is undefined or ``"none"``.
    """
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; valid: {', '.join(BANDS)}")
    y = np.asarray(curves, dtype=np.float64)
    count = np.sum(np.isfinite(y), axis=0)  # seeds with a value, per step
    total = np.nansum(y, axis=0)
    mean = np.divide(total, count, out=np.full(y.shape[1], np.nan), where=count > 0)
    low, high = mean.copy(), mean.copy()
    if band == "std":
        dev = np.where(np.isfinite(y), y - mean, 0.0)
        var = np.divide((dev**2).sum(axis=0), count - 1, out=np.zeros(y.shape[1]), where=count > 1)
        low, high = mean - np.sqrt(var), mean + np.sqrt(var)
    elif band == "minmax":
        ok = count > 0
        low[ok] = np.nanmin(y[:, ok], axis=0)
        high[ok] = np.nanmax(y[:, ok], axis=0)
    return mean, low, high


def training_curves(
    frame: pd.DataFrame,
    metric: str,
    path: str | Path,
    band: str = "std",
    smooth: int = 1,
    title: str | None = None,
) -> Path:
    """One line per method (mean over seeds) with a seed band, against the training step.

    Args:
        frame: rows (method, seed, step, ``metric``), one per logged value.
        metric: the column to plot.
        path: output PNG.
        band: see :func:`seed_band`.
        smooth: trailing moving-average window over steps, applied per seed before averaging.
    """
    if smooth < 1:
        raise ValueError(f"smooth must be a window of at least 1 step, got {smooth}")
    fig, ax = _figure()
    for method, rows in frame.groupby("method", sort=False):
        table = rows.pivot_table(index="step", columns="seed", values=metric, aggfunc="mean")
        table = table.sort_index().rolling(smooth, min_periods=1).mean()
        mean, low, high = seed_band(table.to_numpy().T, band)
        steps = table.index.to_numpy()
        line = ax.plot(steps, mean, label=f"{method} ({table.shape[1]} seeds)")[0]
        if band != "none":
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    band_text = {
        "std": "mean ± sample std over seeds",
        "minmax": "mean, min-max over seeds",
        "none": "mean over seeds",
    }[band]
    ax.set_title(title or f"{metric}: {band_text}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def ablation_deltas(
    deltas: pd.DataFrame, reference: str, path: str | Path, title: str | None = None
) -> Path:
    """Grouped horizontal bars of Delta = M(method) - M(reference) in pp, one colour per env.

    Args:
        deltas: rows (method, env, delta) with delta in percentage points.
    """
    methods = list(dict.fromkeys(deltas["method"]))
    envs = list(dict.fromkeys(deltas["env"]))
    fig, ax = _figure(7.0, 1.2 + 0.5 * len(methods))
    height = 0.8 / max(1, len(envs))
    y = np.arange(len(methods))
    for k, env in enumerate(envs):
        sub = deltas.loc[deltas["env"] == env].set_index("method")["delta"]
        values = np.array([sub.get(m, np.nan) for m in methods], dtype=np.float64)
        offset = (k - (len(envs) - 1) / 2) * height
        ax.barh(y + offset, values, height=height, label=env)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(y, methods)
    ax.invert_yaxis()
    ax.set_xlabel(f"Δ vs {reference} (pp)")
    ax.set_title(title or f"Change relative to {reference}")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def bootstrap_distribution(
    distribution: np.ndarray,
    point: float,
    interval: tuple[float, float],
    p_positive: float,
    path: str | Path,
    title: str | None = None,
    unit: str = "pp",
) -> Path:
    """Histogram of the replicates Delta*_r with the point estimate, the CI and zero marked.

    Args:
        distribution: Delta*_r, shape [R], in ``unit``; point, interval: in ``unit``.
    """
    fig, ax = _figure()
    dist = np.asarray(distribution, dtype=np.float64)
    ax.hist(dist, bins=min(80, max(10, int(np.sqrt(dist.size)))), color="tab:blue", alpha=0.7)
    ax.axvline(point, color="black", linewidth=1.5, label=f"point {point:+.2f} {unit}")
    for edge in interval:
        ax.axvline(edge, color="tab:red", linestyle="--", linewidth=1.2)
    ax.axvspan(
        *interval,
        color="tab:red",
        alpha=0.08,
        label=f"CI [{interval[0]:+.2f}, {interval[1]:+.2f}] {unit}",
    )
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel(f"Δ ({unit})")
    ax.set_ylabel("replicates")
    ax.set_title(title or f"Bootstrap distribution, P(Δ > 0) = {p_positive:.3f}")
    ax.legend(fontsize="small")
    return _save(fig, path)


def performance_profiles(
    taus: np.ndarray,
    profiles: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    path: str | Path,
    title: str | None = None,
    xlabel: str = "score threshold τ",
) -> Path:
    """F(tau) = fraction of (run, task) scores above tau, with its bootstrap band, per method.

    Args:
        taus: thresholds, shape [T].
        profiles: method -> (point[T], low[T], high[T]).
    """
    fig, ax = _figure()
    for method, (point, low, high) in profiles.items():
        line = ax.step(taus, point, where="post", label=method)[0]
        ax.fill_between(
            taus, low, high, step="post", color=line.get_color(), alpha=0.2, linewidth=0
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of runs x tasks with score > τ")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "Performance profiles")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def check_output(path: str | Path) -> Path:
    """Fail early (before any work) when ``path`` is not a writable ``.png`` target."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise ValueError(f"plots are written as PNG; give an output path ending in .png, not {out}")
    if out.exists() and out.is_dir():
        raise ValueError(f"output path {out} is a directory; give a file name ending in .png")
    return out
