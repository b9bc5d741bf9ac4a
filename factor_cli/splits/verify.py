"""Verify split manifests: lock digests, schema, counts, train/eval disjointness, checksums."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .build import COUNT_RULES, overlap
from .manifest import (
    LOCK_NAME,
    MANIFEST_NAMES,
    ManifestError,
    file_digest,
    read_lock,
    read_manifest,
    sha256_text,
)


@dataclass(frozen=True)
class Problem:
    manifest: str
    kind: str
    detail: str


@dataclass(frozen=True)
class Report:
    manifest: str
    rows: int
    train: int
    eval: int
    checked: int
    """Instances whose checksum was recomputed from the environment."""
    note: str


def verify_dir(
    splits_dir: Path,
    sample: int | None = None,
    seed: int = 0,
    env_factory: Callable[[str], object] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[Report], list[Problem]]:
    """Check every manifest in ``splits_dir``.

    ``sample``: recompute at most this many checksums per manifest (None: all). Environments that
    cannot run here are reported, not failed: their checksums are simply not recomputed.
    """
    from factor_cli.envs import availability, make_env

    make: Callable[..., object] = env_factory or make_env
    problems: list[Problem] = []
    reports: list[Report] = []
    try:
        lock = read_lock(splits_dir)
    except ManifestError as exc:
        return [], [Problem(LOCK_NAME, "lock", str(exc))]
    present = {n for n in MANIFEST_NAMES.values() if (splits_dir / n).exists()}
    if not present:
        problems.append(
            Problem(
                str(splits_dir),
                "missing",
                "no manifests; build them with `factor splits build ENV`",
            )
        )
    for name in sorted(set(lock) - present):
        problems.append(Problem(name, "lock", f"listed in {LOCK_NAME} but the file is missing"))
    for env_name, name in MANIFEST_NAMES.items():
        if name not in present:
            continue
        path = splits_dir / name
        if name not in lock:
            problems.append(
                Problem(name, "lock", f"not listed in {LOCK_NAME}; rebuild or re-lock it")
            )
        elif lock[name] != file_digest(path):
            problems.append(
                Problem(name, "lock", f"digest differs from {LOCK_NAME}: the file was edited")
            )
        try:
            rows = read_manifest(path)
        except ManifestError as exc:
            problems.append(Problem(name, "schema", str(exc)))
            continue
        for iid in sorted(overlap(rows))[:20]:
            problems.append(Problem(name, "overlap", f"{iid} is in both train and eval"))
        problems += [Problem(name, "count", p) for p in COUNT_RULES.get(env_name)(rows)]
        checked, note = 0, ""
        missing = availability(env_name)
        if missing:
            note = f"checksums not recomputed: {missing}"
        else:
            ids = sorted({r.instance_id for r in rows})
            if sample is not None and sample < len(ids):
                ids = sorted(random.Random(seed).sample(ids, sample))
            expected: dict[str, set[str]] = {}
            for r in rows:
                expected.setdefault(r.instance_id, set()).add(r.sha256)
            # TWX instances depend on the game parameters recorded in the manifest.
            params = {r.category: r.extra["params"] for r in rows if "params" in r.extra}
            env = make(env_name, params=params) if params else make(env_name)
            try:
                for i, iid in enumerate(ids):
                    got = sha256_text(env.canonical_description(iid))  # type: ignore[attr-defined]
                    for sha in sorted(expected[iid] - {got}):
                        problems.append(
                            Problem(
                                name,
                                "checksum",
                                f"{iid}: recomputed {got[:12]}…, manifest {sha[:12]}…",
                            )
                        )
                    checked += 1
                    if progress:
                        progress(name, i + 1, len(ids))
            finally:
                env.close()  # type: ignore[attr-defined]
            note = (
                "all checksums recomputed"
                if checked == len(expected)
                else f"{checked} sampled checksums recomputed"
            )
        reports.append(
            Report(
                name,
                len(rows),
                sum(r.split == "train" for r in rows),
                sum(r.split == "eval" for r in rows),
                checked,
                note,
            )
        )
    return reports, problems
