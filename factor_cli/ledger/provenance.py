"""What a run was made from: code version, configuration, data splits, hardware.

* git: commit of the working tree that holds the code and whether it differs from that commit
  (tracked changes or untracked files); read-only git commands only (``--no-optional-locks`` so
  that ``git status`` never rewrites the index).
* config hash: a typed config that defines ``digest()`` (:class:`Digestible`, e.g.
  ``TrainConfig.digest()``, which leaves out the where-to-write fields) is hashed by it; any
  other mapping by the SHA-256 of its canonical JSON (keys sorted, no spaces, UTF-8), so two runs
  with equal configs share the hash whatever the key order.
* split digests: the per-manifest SHA-256 digests recorded in ``splits.lock`` of the shipped
  manifests (:func:`factor_cli.resources.splits_dir`) unless another lock file is named.
* hardware: GPU count (``torch.cuda.device_count()``) and name, CPU cores available to the
  process.
* versions: of torch, transformers, DeepSpeed, vLLM, MLflow and the environments' packages,
  Python, the platform and Java (:func:`versions`); :func:`version_conflicts` names what differs
  between runs that a report compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import factor_cli
from factor_cli.resources import splits_dir

LOCK_NAME = "splits.lock"
_GIT_TIMEOUT_S = 20


@dataclass(frozen=True)
class GitState:
    """Code version: ``commit`` is ``"unknown"`` outside a git checkout."""

    commit: str
    dirty: bool
    changed_files: int
    diff: str  # ``git diff HEAD`` of tracked files ("" when clean or unknown)

    @property
    def diff_sha256(self) -> str:
        return hashlib.sha256(self.diff.encode("utf-8")).hexdigest() if self.diff else ""


@dataclass(frozen=True)
class Hardware:
    """Accelerators and CPU cores visible to this process."""

    gpus: int
    gpu_name: str
    cpu_cores: int

    def describe(self) -> str:
        """e.g. ``"8 x NVIDIA H200, 16 CPU cores"`` or ``"no GPU, 2 CPU cores"``."""
        gpu = f"{self.gpus} x {self.gpu_name}" if self.gpus else "no GPU"
        return f"{gpu}, {self.cpu_cores} CPU cores"


def code_root() -> Path:
    """Folder above the installed ``factor_cli`` package (the checkout when installed -e)."""
    return Path(factor_cli.__file__).resolve().parent.parent


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(root: Path | None = None) -> GitState:
    """Commit and dirty flag of the git working tree at ``root`` (default: :func:`code_root`)."""
    cwd = root or code_root()
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return GitState("unknown", False, 0, "")
    status = _git(["status", "--porcelain"], cwd) or ""
    changed = [line for line in status.splitlines() if line.strip()]
    diff = (_git(["diff", "HEAD"], cwd) or "") if changed else ""
    return GitState(commit.strip(), bool(changed), len(changed), diff)


def jsonable(value: Any) -> Any:
    """JSON-ready copy: mappings with string keys, sequences as lists, paths/enums as text."""
    if hasattr(value, "model_dump"):  # pydantic models
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def canonical_json(config: Any) -> str:
    """Canonical JSON text of a config: sorted keys, ``,``/``:`` separators, UTF-8 kept."""
    return json.dumps(
        jsonable(config),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=True,
    )


@runtime_checkable
class Digestible(Protocol):
    """A typed config that defines its own hash (``TrainConfig``): the one definition for it."""

    def digest(self) -> str:
        """SHA-256 (hex) identifying what the config computes."""
        ...


def json_sha256(data: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_json` of ``data``."""
    return hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()


def config_hash(config: Any) -> str:
    """The ledger's ``config_hash`` tag: ``config.digest()`` for a :class:`Digestible` config,
    else :func:`json_sha256` of the mapping."""
    if isinstance(config, Digestible):
        return config.digest()
    return json_sha256(config)


def split_digests(lock: Path | None = None) -> dict[str, str]:
    """``{manifest file: sha256}`` from ``lock`` (default: the shipped manifests' lock file;
    empty when the file is absent).

    Raises:
        ValueError: the lock file exists but is not a JSON object of strings.
    """
    path = lock or (splits_dir() / LOCK_NAME)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the split lock ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object of manifest digests")
    return {str(k): v for k, v in sorted(data.items())}


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask; else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _no_gpu_devices() -> bool:
    """True on Linux when no NVIDIA or AMD device node exists (CUDA cannot be available)."""
    dev = Path("/dev")
    if sys.platform != "linux" or not dev.is_dir():
        return False
    return not any(dev.glob("nvidia[0-9]*")) and not (dev / "kfd").exists()


def hardware() -> Hardware:
    """GPUs seen by torch (0 without CUDA or without torch) and available CPU cores.

    Importing torch takes seconds; it is skipped when torch is not loaded yet and the machine
    has no GPU device node.
    """
    gpus, name = 0, ""
    if "torch" not in sys.modules and _no_gpu_devices():
        return Hardware(0, "", cpu_cores())
    try:
        import torch

        if torch.cuda.is_available():
            gpus = torch.cuda.device_count()
            name = torch.cuda.get_device_name(0) if gpus else ""
    except Exception:  # no torch, or a broken CUDA set-up: report no GPU rather than fail
        gpus, name = 0, ""
    return Hardware(gpus, name, cpu_cores())


VERSIONED = (
    "torch", "transformers", "deepspeed", "vllm", "mlflow",
    "textworld-express", "scienceworld", "alfworld",
)  # fmt: skip
"""Distributions whose version a result may depend on (environments first among them: an
environment upgrade can change every success rate without a line of ours changing)."""
VERSION_TAG = "version."


def versions() -> dict[str, str]:
    """``version.<name>`` tags: each of :data:`VERSIONED` (``absent`` when not installed), the
    Python version, the platform, and the Java runtime (``java -version``'s first line, or
    ``absent``). Read from the installed metadata: nothing is imported."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    for name in VERSIONED:
        try:
            out[VERSION_TAG + name] = version(name)
        except PackageNotFoundError:
            out[VERSION_TAG + name] = "absent"
    out[VERSION_TAG + "python"] = sys.version.split()[0]
    out[VERSION_TAG + "platform"] = sys.platform + "-" + os.uname().machine
    out[VERSION_TAG + "java"] = _java_version()
    return out


def _java_version() -> str:
    try:
        proc = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else "absent"


def version_conflicts(tags: list[Mapping[str, str]]) -> dict[str, list[str]]:
    """For runs' tags, each ``version.<name>`` recorded with more than one value: name -> the
    values, sorted. Runs that predate the tags are left out of the comparison."""
    seen: dict[str, set[str]] = {}
    for t in tags:
        for key, value in t.items():
            if key.startswith(VERSION_TAG):
                seen.setdefault(key[len(VERSION_TAG) :], set()).add(value)
    return {name: sorted(values) for name, values in sorted(seen.items()) if len(values) > 1}
