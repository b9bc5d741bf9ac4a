"""The CPU mini-replication's report (issue 29): export a finished study from the ledger into
small files under ``docs/results/<study>/``, and render ``docs/RESULTS.md`` from those files
alone, so a fresh clone regenerates every table and picture without rerunning anything.

    # where the study ran (its ledger and run folders): once, after `factor study run mini`
    python experiments/mini_results.py export mini
    # anywhere, from the committed files
    python experiments/mini_results.py render

``export`` writes, per study: ``items.csv`` (every run's final greedy evaluation, item level,
the statistics schema plus ``setting`` and ``run_id``), ``curves.csv`` (eval success by step),
``steps.csv`` (training metrics by step), ``runs.csv`` (compute and provenance per run), and
``diagnostics/*.csv`` (the ``factor diagnose`` tables per setting, and td-sign's estimates),
and ``records/`` (each run's per-action records, from which the diagnostics are recomputed).
A study too long for one sitting is exported in parts: ``export STUDY --partial`` after each
sitting adds the cells finished in it (the ledger and run folders of earlier sittings may be
gone; the exported files keep what the page needs), and the next sitting runs the rest
(``factor study run STUDY --seeds ...``).
``render`` reads them, computes the comparisons (hierarchical bootstrap, seed-by-seed wins),
draws the pictures, and fills ``experiments/RESULTS.md.in`` into ``docs/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
TEMPLATE = ROOT / "experiments" / "RESULTS.md.in"
METHODS = (
    "grpo", "serl-repro", "serl-repro-no-kl", "factor", "factor-no-kl", "wo-tac", "wo-hta",
    "factor-mc", "vineppo",
)  # fmt: skip
"""Every row label the studies use, in table order (a row is its study's variant name)."""
COMPARISONS = {
    "distill": (
        ("serl-repro", "serl-repro-no-kl"), ("factor", "factor-no-kl"),
        ("serl-repro-no-kl", "grpo"), ("factor-no-kl", "grpo"),
    ),
    "value-levers": (("factor-warmup", "factor"),),
    "value-features": (("factor-prompt-value", "factor"),),
    "value-states": (
        ("factor-prompt-states", "factor"), ("factor-prompt-states", "factor-prompt-value"),
        ("factor-prompt-value", "factor"),
    ),
    "mini2": tuple((m, b) for m in ("factor", "wo-tac", "wo-hta", "factor-mc", "vineppo")
                   for b in ("grpo", "serl-repro")),
}  # fmt: skip
"""(subject, baseline) pairs per study (by name prefix); the rest: FACTOR against each baseline."""
DEFAULT_COMPARISONS = (("factor", "serl-repro"), ("factor", "grpo"))
STEP_METRICS = (
    "success_rate", "turns_mean", "group_signal", "zero_credit_share", "coef_deviation_median",
    "value_target_mse", "strength", "kl_coef", "kl", "time_rollout", "time_continuations",
    "time_update", "time_teacher", "time_value",
)  # fmt: skip
RESAMPLES = 10_000
PHASE_ORDER = {"early": 0, "late": 1, "all": 2}
BOOT_SEED = 0


GAME_LABELS = {"coin": "coin", "cookingworld": "cooking"}


def setting_order(setting: str) -> tuple[str, int, int]:
    """Sort key of a task label: by game, then rooms and turns as numbers (coin3 T6 before
    coin11 T24, which a string sort would put first)."""
    match = re.fullmatch(r"(\D+)(\d+|\?) T(\d+)", setting)
    if match is None:
        return (setting, 0, 0)
    game, rooms, turns = match.groups()
    return (game, int(rooms) if rooms.isdigit() else 0, int(turns))


def sorted_settings(settings: Any) -> list[str]:
    return sorted(set(settings), key=setting_order)


def setting_of(rooms: str | int, turns: str | int, game: str = "coin") -> str:
    """The task label of a cell: ``coin3 T6`` for three rooms and a 6-turn limit,
    ``cooking1 T12`` for cookingworld with one room and 12 turns."""
    return f"{GAME_LABELS.get(game, game)}{rooms} T{turns}"


# ------------------------------------------------------------------------------------- export


def _setting(cfg: Any) -> str:
    game = cfg.env.games[0]
    params = cfg.env.options["params"].get(game, "")
    rooms = re.search(r"numLocations=(\d+)", params)
    return setting_of(rooms.group(1) if rooms else "?", cfg.env.max_turns, game)


REPLAY_PLANS = {"feedback": (1, 16), "token-perturb": (4, 8)}
"""(samples, actions) of the replaying diagnostics ``export --replays`` adds (seed 0): cheaper
than td-sign's plan, as each drawn action costs a replay of its trajectory (and token-perturb
3N episodes)."""


CELL = ["setting", "method", "seed"]
"""What names a cell in the exported files: a re-export of the same cell replaces its rows."""
ESTIMATE_COLUMNS = ["method", "seed", "run_id", "step", "phase", "traj", "turn", "group",
                    "credit", "a_seq", "value", "q", "v", "mc", "v_returns", "samples",
                    "failed"]  # fmt: skip
"""The td-sign replay's columns kept: enough to recompute td-sign and the value's Table 17."""


def export(
    study: str, out: Path, plan: Any, replays: Path | None = None, partial: bool = False
) -> None:
    """Everything ``render`` needs from the ledger and the run folders (cwd: the study's
    project root), written under ``out``.

    A study that does not fit one sitting is exported in parts (``partial``): each export adds
    the cells finished since, replacing the rows of a cell exported before (:data:`CELL`), and
    keeps the others. The runs' per-action records are kept under ``out/records/`` (a few tens
    of kB per run, gzipped), so the pooled diagnostics are recomputed over every exported run,
    including those whose ledger and folders are gone; only the Monte-Carlo replays (td-sign,
    and with ``replays`` feedback and token-perturb) need a run's folder, and each run is
    replayed once, in the sitting that exports it: the estimates are kept beside the tables."""
    from factor_cli.studies.matrix import expand
    from factor_cli.studies.results import gather
    from factor_cli.studies.spec import load_spec
    from factor_cli.studies.state import matrix_states

    spec, path = load_spec(study)
    matrix = expand(spec, path)
    results = gather(matrix, matrix_states(matrix, 600.0))
    if results.missing and not partial:
        raise SystemExit(f"{study}: {len(results.missing)} cell(s) unfinished; run the study "
                         "first, or export the finished ones with --partial")  # fmt: skip
    if results.items.empty:
        raise SystemExit(f"{study}: no finished cell to export")
    labels = {cell.key: _setting(cell.config) for cell in matrix.cells}
    # Label by the row (distill's "factor-no-kl" runs method factor); the setting column holds
    # the axis point, which the variant's label would repeat ("factor[env.max_turns=6,...]").
    items = results.items.assign(
        setting=results.items["cell_key"].map(labels), method=results.items["row"]
    )
    settings = items.drop_duplicates("run_id").set_index("run_id")["setting"]
    cols = ["setting", "method", "seed", "item_id", "category", "success", "score", "run_id"]
    runs = results.runs.merge(settings.rename("setting"), left_on="run_id", right_index=True)
    runs = _with_change(runs.assign(method=runs["row"]))
    keep = ["setting", "method", "seed", "run_id", "wall_clock_hours", "cpu_core_hours",
            "interactions", "git_commit", "change", "change_low", "change_high"]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    new_runs = runs[keep]
    all_runs = _merge(out / "runs.csv", new_runs, keep[:3])
    _merge(out / "items.csv", items[cols], cols[:4])
    curves, steps = _curves(new_runs)
    _merge(out / "curves.csv", curves, [*CELL, "step"])
    _merge(out / "steps.csv", steps, [*CELL, "step"])
    _store_records(new_runs["run_id"].tolist(), all_runs["run_id"].tolist(), out / "records")
    _export_diagnostics(all_runs, new_runs, out, plan, replays)
    if results.missing:
        print(f"{study}: exported {len(new_runs)} finished run(s); {len(results.missing)} "
              f"cell(s) not finished here ({len(all_runs)} exported in all)")  # fmt: skip


def _merge(path: Path, new: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``new`` written to ``path`` with the rows already there whose cell ``new`` does not
    hold (written whole, renamed into place); returns what was written."""
    from factor_cli.atomic import atomic_target

    frame = new
    if path.exists():
        old = pd.read_csv(path, dtype={"item_id": str, "category": str})
        cells = set(new[CELL].astype(str).itertuples(index=False, name=None))
        mine = old[CELL].astype(str).apply(tuple, axis=1).isin(cells)
        frame = pd.concat([old[~mine], new], ignore_index=True)
    frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    with atomic_target(path) as tmp:
        frame.to_csv(tmp, index=False)
    return frame


def _with_change(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's final-against-start change with its paired 95% CI, as the run logged it."""
    from factor_cli.ledger.store import open_client, resolve_tracking_uri

    client = open_client(resolve_tracking_uri(None), create=False)
    metrics = [client.get_run(r).data.metrics for r in runs["run_id"]]
    return runs.assign(
        change=[m.get("eval_metric_delta", np.nan) for m in metrics],
        change_low=[m.get("eval_metric_delta_ci_low", np.nan) for m in metrics],
        change_high=[m.get("eval_metric_delta_ci_high", np.nan) for m in metrics],
    )


RECORD_KINDS = ("actions", "continuations")


def _store_records(new: list[str], keep: list[str], folder: Path) -> None:
    """The ledger's per-action records of the ``new`` runs under ``folder`` (one gzipped CSV
    per run and kind, with the run's tags); records of runs no longer exported are removed."""
    from factor_cli.atomic import atomic_target
    from factor_cli.ledger.records import load_records

    folder.mkdir(parents=True, exist_ok=True)
    for run_id in new:
        recs = load_records([run_id])
        for kind in RECORD_KINDS:
            with atomic_target(folder / f"{run_id}-{kind}.csv.gz") as tmp:
                getattr(recs, kind).to_csv(tmp, index=False, compression="gzip")
    for stale in folder.glob("*.csv.gz"):
        if stale.name.split("-", 1)[0] not in keep:
            stale.unlink()


def stored_records(folder: Path, run_ids: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(actions, continuations) of ``run_ids`` from ``folder`` (:func:`_store_records`)."""
    frames = []
    for kind in RECORD_KINDS:
        parts = [pd.read_csv(folder / f"{r}-{kind}.csv.gz", dtype={"instance": str},
                             keep_default_na=False, na_values=[""]) for r in run_ids]  # fmt: skip
        frame = pd.concat(parts, ignore_index=True)
        if "action" in frame:  # an action's text may read "None": only an empty field is missing
            frame["action"] = frame["action"].fillna("").astype(str)
        frames.append(frame)
    return frames[0], frames[1]


def _run_dirs(runs: pd.DataFrame) -> dict[str, Path]:
    from factor_cli.ledger.records import load_records

    recs = load_records(runs["run_id"].tolist())
    return {r.run_id: Path(r.run_dir) for r in recs.runs.itertuples() if r.run_dir}


def _curves(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(eval success by step, training metrics by step) of ``runs``, from their folders."""
    folders = _run_dirs(runs)
    curves, steps = [], []
    for run in runs.itertuples(index=False):
        label = {"setting": run.setting, "method": run.method, "seed": run.seed}
        folder = folders[run.run_id]
        for line in (folder / "evals.jsonl").read_text().splitlines():
            rec = json.loads(line)
            curves.append({**label, "step": rec["step"], "success": rec["eval_metric"]})
        last: dict[int, dict] = {}
        for line in (folder / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            last[rec["step"]] = rec  # a resumed run rewrites a step: keep the last
        for k, rec in sorted(last.items()):
            steps.append({**label, "step": k, **{m: rec.get(m) for m in STEP_METRICS}})
    keys = [*CELL, "step"]
    curves_df = pd.DataFrame(curves).drop_duplicates(keys, keep="last").sort_values(keys)
    return curves_df, pd.DataFrame(steps).sort_values(keys)


def _export_diagnostics(
    runs: pd.DataFrame, new: pd.DataFrame, out: Path, plan: Any, replays: Path | None
) -> None:
    """The diagnostics of every exported run (``runs``) from the stored records, the td-sign
    replays of the ``new`` FACTOR runs added to those exported before (``plan``: theirs), and
    likewise feedback and token-perturb (``replays``: their cache; None: no new replays)."""
    from factor_cli.rollout.credit_replay import COMPARED, replay_credit
    from factor_cli.stats import diagnose as d

    folder = out / "diagnostics"
    folder.mkdir(parents=True, exist_ok=True)
    tables: dict[str, list[pd.DataFrame]] = {}
    estimates = _estimates(runs, new, folder / "td-sign-estimates.csv", plan)
    replayed = _replay_estimates(runs, new, folder, replays)
    for (setting, label), group in runs.groupby(["setting", "method"], sort=True):
        # One row (variant) at a time, relabelled: two rows may share a ledger method.
        acts, conts = stored_records(out / "records", group["run_id"].tolist())
        found = {
            "coef-deviation": d.coef_deviation(acts),
            "groups": d.group_signal(acts),
            "length-bias": d.length_bias(acts),
            "horizon": d.horizon(acts),
            "compare": d.credit_agreement(replay_credit(acts), list(COMPARED)),
            "position": d.credit_by_position(acts, seed=BOOT_SEED),
        }
        # Only rows with a value head and continuations (FACTOR's) have a calibration: a row
        # of its own (distill's GRPO, SERL-Repro) has neither.
        if acts["value"].notna().any() and not conts.empty:
            found["value"], found["reliability"] = d.value_calibration(acts, conts)
        est = estimates[estimates["run_id"].isin(group["run_id"])]
        if not est.empty:  # Table 17 against the independent reference
            found["value-mc"] = d.value_against_mc(est, acts, seed=BOOT_SEED)
        for kind, rows in replayed.items():
            mine = rows[rows["run_id"].isin(group["run_id"])]
            if not mine.empty:
                found[kind] = _replay_kinds()[kind][1](mine)
        for name, table in found.items():
            # One environment per setting: the setting column says it.
            table = table.drop(columns="env", errors="ignore").assign(method=label)
            tables.setdefault(name, []).append(table.assign(setting=setting))
    for name, parts in tables.items():
        pd.concat(parts, ignore_index=True).to_csv(folder / f"{name}.csv", index=False)


def reads_values(method: str) -> bool:
    """Whether a method's action credit is read from values V(x_t), a head's or Monte-Carlo's
    (factor, wo-hta, factor-mc, vineppo): td-sign replays those. Broadcast and uniform credit
    have no per-action sign of their own to check."""
    from factor_cli.credit import ESTIMATORS, METHODS

    spec = METHODS.get(method)
    return not spec.critic and ESTIMATORS.get(spec.estimator).uses_values


def _estimates(runs: pd.DataFrame, new: pd.DataFrame, path: Path, plan: Any) -> pd.DataFrame:
    """td-sign's estimates of every exported run whose credit reads values (:func:`reads_values`):
    those exported before (kept while their cell is), and the ``new`` runs' replayed now under
    ``plan`` (cached under runs/)."""
    from rich.progress import Progress

    from factor_cli.atomic import atomic_target
    from factor_cli.diagnostics.td_sign import td_sign_estimates
    from factor_cli.ledger.records import load_records

    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=ESTIMATE_COLUMNS)
    old = old[old["run_id"].isin(runs["run_id"]) & ~old["run_id"].isin(new["run_id"])]
    if not old.empty and int(old["samples"].iloc[0]) != plan.samples:
        raise SystemExit(f"{path}: exported with --samples {int(old['samples'].iloc[0])}; "
                         f"export the rest with the same plan")  # fmt: skip
    # Files from before the column existed were all exported without --to-end.
    old_to_end = (
        bool(old["to_end"].fillna(False).iloc[0]) if "to_end" in old and len(old) else False
    )
    if not old.empty and old_to_end != plan.to_end:
        flag = "with" if old_to_end else "without"
        raise SystemExit(f"{path}: exported {flag} --to-end; export the rest the same way")
    parts = [old]
    for (setting, label), group in new.groupby(["setting", "method"], sort=True):
        recs = load_records(group["run_id"].tolist())
        replayed = recs.runs[recs.runs["method"].map(reads_values)]
        if replayed.empty:
            continue
        with Progress() as bar:
            task = bar.add_task(f"td-sign {setting} {label}", total=None)

            def progress(text: str, i: int, n: int, task: Any = task) -> None:
                bar.update(task, description=text, completed=i, total=n)

            cache = Path("runs") / "td-sign-estimates"
            est = td_sign_estimates(recs.actions, replayed, plan, cache, progress)
        parts.append(
            est[ESTIMATE_COLUMNS].assign(setting=setting, method=label, to_end=plan.to_end)
        )
    frame = pd.concat(parts, ignore_index=True)
    with atomic_target(path) as tmp:
        frame.to_csv(tmp, index=False)
    return frame


def _replay_kinds() -> dict[str, tuple[Any, Any]]:
    """kind -> (its estimates of runs with a teacher, their pooled table per row)."""
    from factor_cli.diagnostics.feedback_probe import feedback_estimates
    from factor_cli.diagnostics.token_perturb import perturb_estimates
    from factor_cli.stats import diagnose as d

    return {"feedback": (feedback_estimates, d.feedback_concentration),
            "token-perturb": (perturb_estimates, d.token_perturb)}  # fmt: skip


def _replay_estimates(
    runs: pd.DataFrame, new: pd.DataFrame, folder: Path, cache: Path | None
) -> dict[str, pd.DataFrame]:
    """feedback and token-perturb estimates (:data:`REPLAY_PLANS`) of every exported run with
    a teacher: those exported before (``folder/<kind>-estimates.csv``, kept while their run is
    exported), and with ``cache`` the ``new`` runs' replayed now (estimates cached under
    ``cache/<kind>``, where ``factor diagnose`` with the same plan leaves them), each labelled
    with its row and setting."""
    from rich.progress import Progress

    from factor_cli.atomic import atomic_target
    from factor_cli.credit import METHODS
    from factor_cli.diagnostics.replay import McPlan
    from factor_cli.ledger.records import load_records

    out = {}
    for kind, (estimate, _) in _replay_kinds().items():
        path = folder / f"{kind}-estimates.csv"
        old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["run_id"])
        parts = [old[old["run_id"].isin(runs["run_id"]) & ~old["run_id"].isin(new["run_id"])]]
        for (setting, label), group in new.groupby(["setting", "method"], sort=True):
            if cache is None:
                break
            recs = load_records(group["run_id"].tolist())
            teacher = recs.runs[recs.runs["method"].map(lambda m: METHODS.get(m).uses_teacher)]
            if teacher.empty:
                continue
            samples, actions = REPLAY_PLANS[kind]
            with Progress() as bar:
                task = bar.add_task(f"{kind} {setting} {label}", total=None)

                def progress(text: str, i: int, n: int, task: Any = task) -> None:
                    bar.update(task, description=text, completed=i, total=n)

                rows = estimate(recs.actions, teacher, McPlan(samples, actions, BOOT_SEED),
                                cache / kind, progress)  # fmt: skip
            parts.append(rows.assign(setting=setting, method=label))
        parts = [p for p in parts if not p.empty]
        empty = pd.DataFrame(columns=["run_id"])
        out[kind] = pd.concat(parts, ignore_index=True) if parts else empty
        if parts or path.exists():
            with atomic_target(path) as tmp:
                out[kind].to_csv(tmp, index=False)
    return out


# ------------------------------------------------------------------------------------- render


def _pp(x: float) -> str:
    return f"{100 * x:+.1f}"


def cell_table(items: pd.DataFrame) -> pd.DataFrame:
    """Final eval success per (setting, method, seed): the macro metric of each run."""
    from factor_cli.stats.metric import run_metrics

    frame = run_metrics(items.assign(env=items["setting"]), ("setting", "method", "seed"))
    return frame[["setting", "method", "seed", "metric"]]


def comparisons(
    items: pd.DataFrame, per_seed: pd.DataFrame, pairs: Sequence[tuple[str, str]]
) -> pd.DataFrame:
    """Each (subject, baseline) pair per setting: hierarchical bootstrap (10,000 resamples,
    seed 0), P(Delta > 0), and seed-by-seed wins / ties / losses, over the seeds both rows ran
    (a row on seeds 1-3 meets a baseline on 1-5 on seeds 1-3: the bootstrap pairs seeds)."""
    from factor_cli.stats.report import BootstrapRequest, bootstrap_report

    rows = []
    wide = per_seed.pivot_table(index=["setting", "seed"], columns="method", values="metric")
    for setting in sorted_settings(items["setting"]):
        frame = items[items["setting"] == setting].assign(env=setting)
        for subject, baseline in pairs:
            if not {subject, baseline} <= set(frame["method"]):
                continue  # a row the spec leaves out at this setting (mini2's factor-mc)
            pair = frame[frame["method"].isin([subject, baseline])]
            seeds = [set(g["seed"]) for _, g in pair.groupby("method")]
            rep = bootstrap_report(
                pair[pair["seed"].isin(set.intersection(*seeds))],
                BootstrapRequest(setting, subject, baseline, RESAMPLES, BOOT_SEED),
            )
            diff = (wide.loc[setting, subject] - wide.loc[setting, baseline]).to_numpy()
            res = rep.result
            rows.append({
                "setting": setting, "comparison": f"{subject} - {baseline}",
                "delta": res.point, "ci_low": res.ci_low, "ci_high": res.ci_high,
                "p_positive": res.p_positive, "wins": int((diff > 1e-9).sum()),
                "ties": int((np.abs(diff) <= 1e-9).sum()), "losses": int((diff < -1e-9).sum()),
            })  # fmt: skip
    return pd.DataFrame(rows)


def study_pairs(name: str) -> Sequence[tuple[str, str]]:
    """The comparisons a study's page shows (:data:`COMPARISONS`, by name prefix)."""
    for prefix, pairs in COMPARISONS.items():
        if name.startswith(prefix):
            return pairs
    return DEFAULT_COMPARISONS


def _md(frame: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    formats = formats or {}
    head = "| " + " | ".join(frame.columns) + " |\n| " + " | ".join("---" for _ in frame) + " |"
    lines = [head]
    for row in frame.itertuples(index=False):
        cells = []
        for col, v in zip(frame.columns, row):
            fmt = formats.get(col)
            if isinstance(v, float) and np.isnan(v):
                cells.append("")
            elif fmt:
                cells.append(format(v, fmt))
            elif isinstance(v, float) and v.is_integer() and abs(v) >= 1:
                cells.append(str(int(v)))
            elif isinstance(v, float):
                cells.append(f"{v:.3g}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main_table(per_seed: pd.DataFrame) -> str:
    rows = []
    for (setting, method), g in per_seed.groupby(["setting", "method"], sort=True):
        g = g.sort_values("seed")
        vals = g["metric"].to_numpy()
        row = {"setting": setting, "method": method,
               "mean ± sd": f"{vals.mean():.3f} ± {vals.std(ddof=1):.3f}"}  # fmt: skip
        row.update({f"seed {s}": f"{v:.2f}" for s, v in zip(g["seed"], vals)})
        rows.append(row)
    frame = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(METHODS)}
    frame = frame.assign(_o=frame["method"].map(order), _s=frame["setting"].map(setting_order))
    return _md(frame.sort_values(["_s", "_o"]).drop(columns=["_o", "_s"]))


def comparison_table(comp: pd.DataFrame) -> str:
    ci = [f"[{_pp(lo)}, {_pp(hi)}]" for lo, hi in zip(comp["ci_low"], comp["ci_high"])]
    seeds = [f"{w} / {t} / {lo}" for w, t, lo in zip(comp["wins"], comp["ties"], comp["losses"])]
    frame = pd.DataFrame({
        "setting": comp["setting"], "comparison": comp["comparison"],
        "Δ (pp)": comp["delta"].map(_pp), "95% CI (pp)": ci,
        "P(Δ > 0)": comp["p_positive"].map(lambda p: f"{p:.3f}"),
        "seeds won / tied / lost": seeds,
    })  # fmt: skip
    return _md(frame)


def gain_table(comp: pd.DataFrame) -> pd.DataFrame:
    """The gain against the horizon (the paper's Table 26 across settings): each comparison's
    Delta [95% CI] in pp, one column per setting in horizon order."""
    triples = comp[["delta", "ci_low", "ci_high"]].itertuples(index=False)
    cells = comp.assign(cell=[f"{_pp(v)} [{_pp(lo)}, {_pp(hi)}]" for v, lo, hi in triples])
    wide = cells.pivot_table(index="comparison", columns="setting", values="cell", aggfunc="first")
    order = list(comp["comparison"].drop_duplicates())
    wide = wide.reindex(index=order, columns=sorted_settings(wide.columns)).fillna("-")
    return wide.reset_index()


def bucket_gain_table(horizon: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """Table 26's own form within each setting: training success by trajectory length (actions)
    of each subject minus each baseline, in pp, one column per length bucket."""
    rows = []
    for setting in sorted_settings(horizon["setting"]):
        part = horizon[horizon["setting"] == setting]
        rate = part.pivot_table(index="method", columns="bucket", values="success")
        for subject, baseline in pairs:
            if {subject, baseline} <= set(rate.index):
                diff = (rate.loc[subject] - rate.loc[baseline]).map(
                    lambda v: "-" if np.isnan(v) else _pp(v))  # fmt: skip
                rows.append({"setting": setting, "comparison": f"{subject} - {baseline}",
                             **diff.to_dict()})  # fmt: skip
    frame = pd.DataFrame(rows)
    buckets = [c for c in frame.columns if c not in ("setting", "comparison")]
    buckets.sort(key=lambda b: int(re.match(r"\D*(\d+)", str(b)).group(1)))
    return frame[["setting", "comparison", *buckets]].fillna("-")


def gain_plot(comp: pd.DataFrame, out: Path) -> None:
    """Each comparison's Delta with its 95% CI against the setting (horizon order)."""
    from matplotlib.figure import Figure

    settings = sorted_settings(comp["setting"])
    baselines = sorted({c.split(" - ")[1] for c in comp["comparison"]})
    fig = Figure(figsize=(5.0 * len(baselines), 3.6), layout="constrained")
    axes = fig.subplots(1, len(baselines), squeeze=False)[0]
    x = {s: i for i, s in enumerate(settings)}
    for ax, baseline in zip(axes, baselines):
        part = comp[comp["comparison"].str.endswith(f" - {baseline}")]
        subjects = list(part["comparison"].drop_duplicates())
        for j, name in enumerate(subjects):
            g = part[part["comparison"] == name]
            xs = np.array([x[s] for s in g["setting"]]) + 0.08 * (j - (len(subjects) - 1) / 2)
            err = [100 * (g["delta"] - g["ci_low"]), 100 * (g["ci_high"] - g["delta"])]
            ax.errorbar(xs, 100 * g["delta"], yerr=err, marker="o", capsize=3,
                        label=name.split(" - ")[0])  # fmt: skip
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(settings)), settings)
        ax.set_xlim(-0.5, len(settings) - 0.5)
        ax.set_title(f"final success minus {baseline} (pp, 95% CI)", fontsize=8)
        ax.legend(fontsize=7)
    fig.savefig(out, dpi=110)


def curves_plot(curves: pd.DataFrame, out: Path) -> None:
    from matplotlib.figure import Figure

    settings = sorted_settings(curves["setting"])
    fig = Figure(figsize=(5.0 * len(settings), 3.6), layout="constrained")
    axes = fig.subplots(1, len(settings), squeeze=False)[0]
    for ax, setting in zip(axes, settings):
        part = curves[curves["setting"] == setting]
        for method in [m for m in METHODS if m in set(part["method"])]:
            g = part[part["method"] == method].groupby("step")["success"]
            mean, low, high = g.mean(), g.min(), g.max()
            (line,) = ax.plot(mean.index, mean.to_numpy(), marker="o", label=method)
            ax.fill_between(mean.index, low.to_numpy(), high.to_numpy(), alpha=0.12,
                            color=line.get_color())  # fmt: skip
        ax.set_title(
            f"{setting}: greedy eval success (mean, band = min-max over seeds)", fontsize=8
        )
        ax.set_xlabel("training step")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("macro success, 100 eval items")
    fig.savefig(out, dpi=110)


def _diag(folder: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(folder / "diagnostics" / f"{name}.csv")


def study_blocks(folder: Path) -> dict[str, str]:
    """The Markdown tables of one exported study, keyed ``<study>.<table>``."""
    from factor_cli.stats import diagnose as d

    name = folder.name
    items = pd.read_csv(folder / "items.csv", dtype={"item_id": str, "category": str})
    per_seed = cell_table(items)
    curves = pd.read_csv(folder / "curves.csv")
    curves_plot(curves, folder / "curves.png")
    runs = pd.read_csv(folder / "runs.csv")
    est = pd.read_csv(folder / "diagnostics" / "td-sign-estimates.csv")
    sign = pd.concat([d.td_sign(g, seed=BOOT_SEED).assign(setting=s)
                      for s, g in est.groupby("setting", sort=True)])  # fmt: skip
    comp = comparisons(items, per_seed, study_pairs(name))
    blocks = {
        "main": main_table(per_seed),
        "comparisons": comparison_table(comp),
        "curves": _md(_curve_table(curves)),
        "compute": _md(_compute_table(runs)),
        "td-sign": _md(sign[["setting", *sign.columns[:-1]]]),
        "hours": f"{runs['cpu_core_hours'].sum() / 2:.1f}",
        "td-sign-plan": f"--samples {int(est['samples'].iloc[0])} --actions "
        f"{int(est.groupby(['run_id', 'step']).size().max())}",
    }
    for kind in ("coef-deviation", "value", "length-bias", "horizon"):
        table = _diag(folder, kind)
        blocks[kind] = _md(table[["setting", *[c for c in table if c != "setting"]]])
    blocks["gain"] = _md(gain_table(comp))
    blocks["bucket-gain"] = _md(bucket_gain_table(_diag(folder, "horizon"), study_pairs(name)))
    if comp["setting"].nunique() >= 3:  # a horizon sweep (mini2): the gain as a picture
        gain_plot(comp, folder / "gain.png")
    for kind in ("compare", "feedback", "token-perturb"):  # exported since 2026-12-03
        if (folder / "diagnostics" / f"{kind}.csv").exists():
            table = _diag(folder, kind).drop(columns="env", errors="ignore")
            blocks[kind] = _md(table[["setting", *[c for c in table if c != "setting"]]])
    groups = _diag(folder, "groups").groupby(["setting", "method"], as_index=False)[
        ["group_signal", "zero_credit"]].mean()  # fmt: skip
    blocks["groups-summary"] = _md(groups)
    if (folder / "diagnostics" / "position.csv").exists():  # exported since 2026-12-05
        blocks["position"] = _md(position_table(_diag(folder, "position")))
    if (folder / "diagnostics" / "value-mc.csv").exists():
        blocks["value-mc"] = _md(value_mc_table(_diag(folder, "value-mc")))
        blocks["runs"] = _md(run_table(folder))  # exported with records since 2026-12-06
    if name in BESIDE and (folder.parent / BESIDE[name] / "items.csv").exists():
        blocks["beside-paper"] = _md(beside_paper(folder, folder.parent / BESIDE[name]))
    return {f"{name}.{k}": v for k, v in blocks.items()}


# The paper's own figure for each diagnostic: (diagnostic, method) -> (value, where).
PAPER = {
    ("TD credit's sign agreement, early", "factor"): ("0.768", "Fig. 5B, steps 11-49"),
    ("TD credit's sign agreement, late", "factor"): ("0.892", "Fig. 5B"),
    ("value: Pearson r, late", "factor"): ("0.83-0.91", "Table 17, step 50"),
    ("value: sign accuracy, late", "factor"): ("0.876-0.921", "Table 17, steps 40-50"),
    ("value: MSE, late", "factor"): ("0.031-0.057", "Table 17, step 50"),
    ("value: spread sd(V)/sd(V^MC) in a step", "factor"): ("not reported", ""),
    ("coefficient deviation, median", "factor"): ("<4e-7", "Fig. 5A, Table 18"),
    ("coefficient deviation, median", "serl-repro"): ("0.067", "Fig. 5A"),
    ("shuffled feedback: concentration true / shuffled / none", "factor"): (
        "0.38 / 0.21 / 0.17", "Table 27, mean $\\rho_{\\max}$"),
    ("token perturbation AUC, positive / negative credit", "factor"): ("0.65 / 0.60", "Fig. 5C"),
}  # fmt: skip
VALUE_ROWS = {
    "pearson": "value: Pearson r, late", "sign_accuracy": "value: sign accuracy, late",
    "mse": "value: MSE, late", "spread": "value: spread sd(V)/sd(V^MC) in a step",
}  # fmt: skip
# The study each study's diagnostics stand beside (the first replication for the second).
BESIDE = {"mini2": "mini"}


def _each(values: dict[str, str]) -> str:
    """Per-setting values in one cell: ``0.52 (coin3 T6); 0.55 (coin6 T12)``."""
    if not values:
        return "not measured"
    return "; ".join(
        f"{v} ({s})" for s, v in sorted(values.items(), key=lambda kv: setting_order(kv[0]))
    )


def _measured(folder: Path) -> dict[tuple[str, str], str]:
    """One study's value of each :data:`PAPER` row it has the data for (late = its last kept
    steps, as its tables)."""
    from factor_cli.stats import diagnose as d

    diag = folder / "diagnostics"
    out: dict[tuple[str, str], dict[str, str]] = {}

    def put(row: str, method: str, setting: str, text: str) -> None:
        out.setdefault((row, method), {})[setting] = text

    est = pd.read_csv(diag / "td-sign-estimates.csv")
    for (setting, method), g in est[est["method"] == "factor"].groupby(["setting", "method"]):
        sign = d.td_sign(g, seed=BOOT_SEED).set_index("phase")
        for phase in ("early", "late"):
            if phase in sign.index and not np.isnan(sign.loc[phase, "agreement"]):
                put(f"TD credit's sign agreement, {phase}", method, setting,
                    f"{sign.loc[phase, 'agreement']:.2f}")  # fmt: skip
    if (diag / "value-mc.csv").exists():  # against the independent reference
        vmc = pd.read_csv(diag / "value-mc.csv")
        late = vmc[(vmc["phase"] == "late") & (vmc["method"] == "factor")]
        for row in late.itertuples(index=False):
            if row.metric in VALUE_ROWS:
                put(VALUE_ROWS[row.metric], "factor", row.setting, f"{row.value:.2f}")
    else:  # the first replication measured the head against its own training targets
        for row in pd.read_csv(diag / "value.csv").itertuples(index=False):
            put("value: Pearson r, late", row.method, row.setting, f"{row.pearson:.2f} vs targets")
            put("value: MSE, late", row.method, row.setting, f"{row.mse:.2f} vs targets")
    for row in pd.read_csv(diag / "coef-deviation.csv").itertuples(index=False):
        if row.method in ("factor", "serl-repro"):
            put("coefficient deviation, median", row.method, row.setting, f"{row.median:.1g}")
    if (diag / "feedback.csv").exists():
        fb = pd.read_csv(diag / "feedback.csv")
        for setting, g in fb[fb["method"] == "factor"].groupby("setting"):
            mass = g.set_index("condition")["top_mass"]
            put("shuffled feedback: concentration true / shuffled / none", "factor", setting,
                " / ".join(f"{mass[c]:.3f}" for c in ("true", "shuffled", "none"))
                + f" (uniform {g['uniform_top_mass'].iloc[0]:.3f})")  # fmt: skip
    if (diag / "token-perturb.csv").exists():
        tp = pd.read_csv(diag / "token-perturb.csv")
        for setting, g in tp[tp["method"] == "factor"].groupby("setting"):
            auc = g.set_index("sign")["auc"]
            put(
                "token perturbation AUC, positive / negative credit",
                "factor",
                setting,
                f"{auc.get('positive', np.nan):.2f} / {auc.get('negative', np.nan):.2f}",
            )
    return {key: _each(v) for key, v in out.items()}


def beside_paper(folder: Path, first: Path) -> pd.DataFrame:
    """Each diagnostic of :data:`PAPER` three times: the paper's figure, the first replication's
    (``first``) and this study's (``folder``); a study that did not measure one says so."""
    this, before = _measured(folder), _measured(first)
    rows = [{"diagnostic": row, "method": method, "paper": f"{value} ({where})" if where else value,
             "first replication": before.get((row, method), "not measured"),
             "this one": this.get((row, method), "not measured")}
            for (row, method), (value, where) in PAPER.items()]  # fmt: skip
    return pd.DataFrame(rows)


def position_table(position: pd.DataFrame, turns: int = 6) -> pd.DataFrame:
    """Credit by position, condensed: the mean share s_t = A*_t / A^seq of the rows whose
    credit is not a broadcast (s_t = 1 everywhere says nothing), per setting, method and result,
    at the first ``turns`` turns and the last action (the CSV keeps every turn and the CIs)."""
    keep = [str(t) for t in range(turns)] + ["last"]
    part = position[position["position"].astype(str).isin(keep)]
    part = part[part.groupby("method")["share"].transform(lambda s: (s - 1).abs().max() > 1e-6)]
    wide = part.pivot_table(
        index=["setting", "method", "result"], columns="position", values="share"
    )
    return wide[[c for c in keep if c in wide.columns]].reset_index()


def value_mc_table(value_mc: pd.DataFrame) -> pd.DataFrame:
    """Table 17 per setting, method and phase: each metric as ``point [low, high]``, with the
    reference's noise ceiling for Pearson r and sign accuracy."""
    frame = value_mc.assign(
        cell=[f"{v:.3g} [{lo:.3g}, {hi:.3g}]" for v, lo, hi in
              value_mc[["value", "ci_low", "ci_high"]].itertuples(index=False)]
    )  # fmt: skip
    index = ["setting", "method", "phase", "states"]
    wide = frame.pivot_table(index=index, columns="metric", values="cell", aggfunc="first")
    ceilings = frame.dropna(subset=["ceiling"]).pivot_table(
        index=index, columns="metric", values="ceiling", aggfunc="first"
    )
    for metric in ceilings.columns:
        wide[f"{metric} ceiling"] = ceilings[metric]
    out = wide.reset_index().assign(order=lambda f: f["phase"].map(PHASE_ORDER))
    out = out.sort_values(["setting", "method", "order"]).drop(columns="order")
    return out.reset_index(drop=True)


def run_table(folder: Path, turns: int = 6) -> pd.DataFrame:
    """One row per exported run whose credit has a value head (issue 37's per-seed check): greedy
    success at the start and the end, the change with the paired 95% CI the run logged; late in
    the run, the value against the independent reference (Pearson r, bias, sign accuracy,
    spread within a step, each with its noise ceiling where it has one) and TD credit's sign
    agreement; and in successful trajectories, the first action's mean credit share
    A*_0 / A^seq [95% CI] and the lowest mean share over turns 0..``turns``-1 (negative: some
    position is pushed against a win)."""
    runs = pd.read_csv(folder / "runs.csv")
    curves = pd.read_csv(folder / "curves.csv")
    est = pd.read_csv(folder / "diagnostics" / "td-sign-estimates.csv")
    replayed = runs[runs["run_id"].isin(est["run_id"])]
    rows = [_run_row(folder, run, curves, est[est["run_id"] == run.run_id], turns)
            for run in replayed.itertuples(index=False)]  # fmt: skip
    return pd.DataFrame(rows).sort_values(["method", "seed"]).reset_index(drop=True)


def _ci(v: float, lo: float, hi: float, signed: bool = True) -> str:
    f = "+.2f" if signed else ".2f"
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]"


def _run_row(folder: Path, run: Any, curves: pd.DataFrame, est: pd.DataFrame, turns: int) -> dict:
    """:func:`run_table`'s row of one run (``est``: its td-sign estimates)."""
    from factor_cli.stats import diagnose as d

    acts, _ = stored_records(folder / "records", [run.run_id])
    curve = curves[(curves["method"] == run.method) & (curves["seed"] == run.seed)]
    curve = curve.set_index("step")["success"].sort_index()
    value = d.value_against_mc(est, acts, seed=BOOT_SEED)
    value = value[value["phase"] == "late"].set_index("metric")
    v = {m: _ci(*value.loc[m, ["value", "ci_low", "ci_high"]], signed=m == "bias")
         for m in ("pearson", "bias", "sign_accuracy", "spread") if m in value.index}  # fmt: skip
    sign = d.td_sign(est, seed=BOOT_SEED).set_index("phase")
    pos = d.credit_by_position(acts, seed=BOOT_SEED)
    wins = pos[pos["result"] == "success"].set_index("position")
    shares = wins.loc[[str(t) for t in range(turns) if str(t) in wins.index], "share"]
    late = sign.loc["late"] if "late" in sign.index else None
    return {
        "method": run.method, "seed": run.seed,
        "start -> end": f"{curve.iloc[0]:.2f} -> {curve.iloc[-1]:.2f}",
        "change [95% CI]": _ci(run.change, run.change_low, run.change_high),
        "value r / ceiling": f"{v['pearson']} / {value.loc['pearson', 'ceiling']:.2f}",
        "value bias": v["bias"],
        "value spread / ceiling": "-" if "spread" not in v else
            f"{v['spread']} / {value.loc['spread', 'ceiling']:.2f}",
        "value sign acc. / ceiling":
            f"{v['sign_accuracy']} / {value.loc['sign_accuracy', 'ceiling']:.2f}",
        "TD sign agr. / ceiling": "-" if late is None else
            f"{_ci(*late[['agreement', 'ci_low', 'ci_high']], signed=False)} / "
            f"{late['ceiling']:.2f}",
        "first action of a win": "-" if "0" not in wins.index else
            _ci(*wins.loc["0", ["share", "share_low", "share_high"]]),
        f"lowest share, turns 0-{turns - 1}": f"{shares.min():+.2f}",
    }  # fmt: skip


def render(results: Path, template: Path) -> str:
    """``docs/RESULTS.md`` from the exported files (and the pictures beside them): every
    ``{{ study.table }}`` of the template filled from ``results/<study>/``."""
    blocks: dict[str, str] = {}
    for folder in sorted(p for p in results.iterdir() if (p / "items.csv").exists()):
        blocks.update(study_blocks(folder))
    text = template.read_text()
    missing = sorted(set(re.findall(r"\{\{ ([\w.-]+) \}\}", text)) - set(blocks))
    if missing:
        raise SystemExit(f"{template}: no data for {', '.join(missing)}")
    return re.sub(r"\{\{ ([\w.-]+) \}\}", lambda m: blocks[m.group(1)], text)


def _curve_table(curves: pd.DataFrame) -> pd.DataFrame:
    mean = curves.groupby(["setting", "method", "step"], as_index=False)["success"].mean()
    wide = mean.pivot_table(index=["setting", "method"], columns="step", values="success")
    wide.columns = [f"step {c}" for c in wide.columns]
    return wide.reset_index()


def _compute_table(runs: pd.DataFrame) -> pd.DataFrame:
    g = runs.groupby(["setting", "method"], as_index=False).agg(
        runs=("run_id", "size"), wall_clock_h=("wall_clock_hours", "sum"),
        cpu_core_h=("cpu_core_hours", "sum"), interactions=("interactions", "sum"),
    )  # fmt: skip
    total = pd.DataFrame([{"setting": "all", "method": "all", "runs": int(g["runs"].sum()),
                           "wall_clock_h": g["wall_clock_h"].sum(),
                           "cpu_core_h": g["cpu_core_h"].sum(),
                           "interactions": g["interactions"].sum()}])  # fmt: skip
    return pd.concat([g, total], ignore_index=True).astype({"interactions": int})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="ledger + run folders -> docs/results/STUDY/")
    ex.add_argument("study")
    ex.add_argument("--out", type=Path, default=None)
    ex.add_argument("--samples", type=int, default=16, help="td-sign continuations per side")
    ex.add_argument("--actions", type=int, default=32, help="td-sign actions per replayed step")
    ex.add_argument("--replays", type=Path, default=None, metavar="CACHE",
                    help="also feedback and token-perturb of the runs exported now, cached "
                         "under CACHE/<kind> (kept beside the tables for later parts)")  # fmt: skip
    ex.add_argument(
        "--partial",
        action="store_true",
        help="export the finished cells now, the rest later (a study in sittings)",
    )
    ex.add_argument("--to-end", action="store_true",
                    help="td-sign's continuations play to the episode's end (not the run's "
                    "continuations.horizon)")  # fmt: skip
    ru = sub.add_parser("runs", help="docs/results/STUDY/ -> a table of its runs (Markdown)")
    ru.add_argument("study")
    re_ = sub.add_parser("render", help="docs/results/ -> docs/RESULTS.md")
    re_.add_argument("--results", type=Path, default=RESULTS)
    re_.add_argument("--out", type=Path, default=ROOT / "docs" / "RESULTS.md")
    re_.add_argument("--template", type=Path, default=TEMPLATE)
    args = parser.parse_args(argv)
    if args.command == "export":
        out = args.out or RESULTS / args.study
        from factor_cli.diagnostics.replay import McPlan

        plan = McPlan(args.samples, args.actions, BOOT_SEED, to_end=args.to_end)
        export(args.study, out, plan, args.replays, args.partial)
    elif args.command == "runs":
        folder = RESULTS / args.study
        needed = [folder / "runs.csv", folder / "diagnostics" / "td-sign-estimates.csv"]
        missing = [p for p in needed if not p.exists()]
        if not (folder / "records").is_dir():
            missing.append(folder / "records")
        if missing:
            raise SystemExit(f"{missing[0]}: not found; export the study first "
                             f"(mini_results.py export {args.study} --partial)")  # fmt: skip
        print(_md(run_table(folder)))
    else:
        args.out.write_text(render(args.results, args.template))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
