"""The paper's evaluation metric: the unweighted macro average of per-category success rates.

For one run (env, method, seed) with evaluation items i = 1..N, binary success s_i and category
c(i) in {1..C}, the category sizes are n_c = #{i : c(i) = c} and

    M = (1/C) * sum_c (1/n_c) * sum_{i: c(i) = c} s_i  =  sum_i w_i * s_i,
    w_i = 1 / (C * n_{c(i)})                          (sum_i w_i = 1)

ALFWorld: C = 6 task types; ScienceWorld: C = the task type x level cells; WebShop: C = 1, so M
is the plain mean success. Because M is linear in s with fixed weights, the macro difference of
two methods evaluated on the same items is sum_i w_i * (s^A_i - s^B_i): the bootstrap and the
stratified McNemar test both rest on this identity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

#: One run of the toolkit: an (env, method, seed) triple (plus any study column, e.g. backbone).
RUN_KEYS: tuple[str, ...] = ("env", "method", "seed")


def stratum_codes(category: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Integer stratum codes of a category vector.

    Args:
        category: category label of each item, shape [N] (any hashable dtype).

    Returns:
        (codes[N] int64 in [0, C), names[C]) with names in order of first appearance.
    """
    values = pd.Series(np.asarray(category))
    codes, names = pd.factorize(values, sort=False)
    return codes.astype(np.int64), np.asarray(names)


def macro_weights(codes: np.ndarray) -> np.ndarray:
    """Item weights w_i = 1 / (C * n_{c(i)}) of the macro average; shape [N], sum 1.

    Args:
        codes: stratum code of each item, shape [N], int in [0, C), every code present.
    """
    codes = np.asarray(codes, dtype=np.int64)
    if codes.size == 0:
        raise ValueError("the macro metric needs at least one item; got an empty category vector")
    sizes = np.bincount(codes)  # n_c, shape [C]
    if np.any(sizes == 0):
        raise ValueError("category codes must be 0..C-1 with every code present")
    return 1.0 / (sizes.size * sizes[codes])


def macro_success(success: ArrayLike, category: ArrayLike) -> float:
    """M = (1/C) sum_c mean_{i in c} s_i for one run.

    Args:
        success: s_i in {0, 1} (or any score to macro-average), shape [N].
        category: category label of each item, shape [N].
    """
    s = np.asarray(success, dtype=np.float64)
    codes, _ = stratum_codes(category)
    if s.shape != codes.shape:
        raise ValueError(f"success has shape {s.shape} but category has shape {codes.shape}")
    return float(np.dot(macro_weights(codes), s))


def category_rates(results: pd.DataFrame, keys: Sequence[str] = RUN_KEYS) -> pd.DataFrame:
    """Per-category success rate of every run.

    Args:
        results: validated item-level results (one row per item of a run; columns ``keys``,
            ``category``, ``success``).
        keys: the columns identifying a run.

    Returns:
        One row per (run, category): columns ``keys`` + ``category``, ``rate`` (mean success in
        the category, a fraction), ``n_items``; categories in order of first appearance.
    """
    grouped = results.groupby([*keys, "category"], sort=False, dropna=False)["success"]
    out = grouped.agg(rate="mean", n_items="size").reset_index()
    out["rate"] = out["rate"].astype(np.float64)
    return out


def run_metrics(results: pd.DataFrame, keys: Sequence[str] = RUN_KEYS) -> pd.DataFrame:
    """The macro metric M of every run (see the module docstring).

    Returns:
        One row per run: columns ``keys`` + ``metric`` (a fraction in [0, 1]), ``n_items``,
        ``n_categories``; runs in order of first appearance.
    """
    cats = category_rates(results, keys)
    grouped = cats.groupby(list(keys), sort=False, dropna=False)
    out = grouped.agg(
        metric=("rate", "mean"), n_items=("n_items", "sum"), n_categories=("rate", "size")
    ).reset_index()
    return out


def score_matrix(
    frame: pd.DataFrame, value: str, task: str, tasks: Sequence[str], run: str = "seed"
) -> tuple[np.ndarray, list[object]]:
    """Pivot one method's per-run scores into the (runs x tasks) matrix of the aggregates.

    Args:
        frame: rows of one method, one per (run, task), with columns ``run``, ``task``, ``value``.
        value: the score column (e.g. ``metric``).
        task: the column naming the task (e.g. ``env``).
        tasks: the tasks to keep, in column order; M = len(tasks).
        run: the column naming the run (the training seed).

    Returns:
        (scores[N_runs, M], run labels[N_runs]); scores[n, m] is the score of run n on task m.
    """
    table = frame.pivot_table(index=run, columns=task, values=value, aggfunc="first", sort=True)
    missing_tasks = [t for t in tasks if t not in table.columns]
    if missing_tasks:
        raise ValueError(
            f"no results for {task} {missing_tasks[0]!r}; present: "
            f"{', '.join(map(str, table.columns))}"
        )
    table = table.loc[:, list(tasks)]
    holes = table.isna()
    if holes.to_numpy().any():
        r, c = np.argwhere(holes.to_numpy())[0]
        raise ValueError(
            f"{run} {table.index[r]} has no result for {task} {table.columns[c]!r}; the "
            f"(runs x tasks) matrix needs every {run} evaluated on every {task} (drop the "
            f"incomplete {run} or the {task})"
        )
    return table.to_numpy(dtype=np.float64), list(table.index)
