"""Manifest files: one CSV per environment and a lock file with each manifest's digest.

Columns (at least): ``instance_id, split, category, episode, sha256``. ``split`` is train or eval;
``episode`` numbers repeats of an instance within a split (0 unless a cell has too few
instances); ``sha256`` is the SHA-256 of the instance's canonical description read from the
environment itself. Files are written to a temporary file and renamed, never half-written.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from factor_cli.atomic import atomic_write_text

REQUIRED = ("instance_id", "split", "category", "episode", "sha256")
SPLITS = ("train", "eval")
LOCK_NAME = "splits.lock"
MANIFEST_NAMES = {
    "scienceworld": "sciworld_ids.csv",
    "twx": "twx_ids.csv",
    "alfworld": "alfworld_ids.csv",
    "webshop": "webshop_ids.csv",
}


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file, row and column."""


@dataclass(frozen=True)
class Row:
    instance_id: str
    split: str
    category: str
    episode: int = 0
    sha256: str = ""
    extra: dict[str, str] = field(default_factory=dict)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    atomic_write_text(path, text)


def write_manifest(path: Path, rows: Sequence[Row]) -> None:
    extra_cols = sorted({k for r in rows for k in r.extra})
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*REQUIRED, *extra_cols])
    for r in rows:
        w.writerow(
            [
                r.instance_id,
                r.split,
                r.category,
                r.episode,
                r.sha256,
                *(r.extra.get(c, "") for c in extra_cols),
            ]
        )
    atomic_write(path, buf.getvalue())


def read_manifest(path: Path) -> list[Row]:
    """Read and validate a manifest; bad files raise ManifestError naming file, row and column."""
    if not path.exists():
        raise ManifestError(f"{path}: no such manifest; build it with `factor splits build ENV`")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        missing = [c for c in REQUIRED if c not in cols]
        if missing:
            raise ManifestError(
                f"{path}: missing column(s) {', '.join(missing)}; "
                f"a manifest needs {', '.join(REQUIRED)}"
            )
        rows: list[Row] = []
        seen: set[tuple[str, str, int]] = set()
        for line, rec in enumerate(reader, start=2):
            where = f"{path}:{line}"
            if rec["split"] not in SPLITS:
                raise ManifestError(f"{where}: column split is {rec['split']!r}; use train or eval")
            if not rec["instance_id"]:
                raise ManifestError(f"{where}: column instance_id is empty")
            try:
                episode = int(rec["episode"])
            except ValueError:
                raise ManifestError(
                    f"{where}: column episode is {rec['episode']!r}, not an integer"
                ) from None
            sha = rec["sha256"]
            if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise ManifestError(
                    f"{where}: column sha256 is not a 64-digit lowercase hex digest"
                )
            key = (rec["instance_id"], rec["split"], episode)
            if key in seen:
                raise ManifestError(
                    f"{where}: duplicate row for {rec['instance_id']} "
                    f"({rec['split']}, episode {episode})"
                )
            seen.add(key)
            extra = {k: v for k, v in rec.items() if k not in REQUIRED and k is not None}
            rows.append(Row(rec["instance_id"], rec["split"], rec["category"], episode, sha, extra))
    return rows


def read_lock(splits_dir: Path) -> dict[str, str]:
    path = splits_dir / LOCK_NAME
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(
            f"{path}: not valid JSON ({exc.msg}); rebuild with `factor splits build`"
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ManifestError(f"{path}: must map manifest file names to sha256 digests")
    return data


def update_lock(splits_dir: Path, names: Iterable[str]) -> dict[str, str]:
    """Record the current digest of each named manifest in the lock file."""
    lock = read_lock(splits_dir)
    for name in names:
        lock[name] = file_digest(splits_dir / name)
    atomic_write(splits_dir / LOCK_NAME, json.dumps(dict(sorted(lock.items())), indent=1) + "\n")
    return lock
