"""`factor splits build` and `factor verify-splits`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from factor_cli.envs import EnvError, availability, make_env
from factor_cli.resources import splits_dir as resolve_splits_dir
from factor_cli.splits.build import PLANNERS, build_manifest
from factor_cli.splits.manifest import ManifestError
from factor_cli.splits.verify import verify_dir

from .common import console, fail

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Split manifests with per-instance SHA-256 checksums.",
    no_args_is_help=True,
)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


@app.command("build")
def build_cmd(
    env_name: str = typer.Argument(..., metavar="ENV", help="scienceworld, twx or alfworld."),
    splits_dir: Path | None = typer.Option(
        None, "--splits-dir", help="Where manifests live (default: the shipped ones)."
    ),
    seed: int = typer.Option(0, help="Seed of the split rule (the same seed gives the same file)."),
    tasks: str | None = typer.Option(None, help="ScienceWorld only: comma-separated task subset."),
    data_root: Path | None = typer.Option(
        None, help="ALFWorld only: data root (default: the adapter's)."
    ),
) -> None:
    """Build ENV's manifest deterministically and record its digest in splits.lock.

    The rules (paper Appendix B) are documented in factor_cli/splits/build.py and
    docs/environments.md.
    """
    splits_dir = resolve_splits_dir(splits_dir)
    if env_name not in PLANNERS:
        fail(f"no split rule for {env_name!r}; valid: {', '.join(PLANNERS.names())}")
    env_options: dict = {"data_root": data_root} if data_root is not None else {}
    missing = availability(env_name, **env_options)
    if missing:
        fail(f"{env_name}: {missing}")
    options: dict = {}
    if tasks:
        options["tasks"] = [t.strip() for t in tasks.split(",") if t.strip()]
    try:
        with make_env(env_name, **env_options) as env, _progress() as bar:
            job = bar.add_task(f"checksums {env_name}", total=None)
            path = build_manifest(
                env_name,
                env,
                splits_dir,
                seed,
                progress=lambda i, n: bar.update(job, completed=i, total=n),
                **options,
            )
    except (EnvError, ValueError) as exc:
        fail(f"{env_name}: {exc}")
    console.print(Text(f"wrote {path} (digest recorded in {splits_dir / 'splits.lock'})"))


def verify_cmd(
    splits_dir: Path | None = typer.Option(
        None, "--splits-dir", help="Folder of manifests + splits.lock (default: the shipped ones)."
    ),
    sample: int | None = typer.Option(
        None, min=1, help="Recompute at most N checksums per manifest (default: all)."
    ),
) -> None:
    """Verify split manifests against their lock digests and environments.

    Checks each manifest's digest in splits.lock, its columns and rows, the per-cell counts, zero
    train/eval overlap, and recomputes per-instance checksums from every environment that can
    run here. Prints a table of problems and exits 1 on any.
    """
    splits_dir = resolve_splits_dir(splits_dir)
    if not splits_dir.is_dir():
        fail(
            f"{splits_dir}: no such folder; "
            "pass --splits-dir or build with `factor splits build ENV`"
        )
    try:
        with _progress() as bar:
            jobs: dict[str, int] = {}

            def tick(name: str, i: int, n: int) -> None:
                if name not in jobs:
                    jobs[name] = bar.add_task(f"verify {name}", total=n)
                bar.update(jobs[name], completed=i)

            reports, problems = verify_dir(splits_dir, sample=sample, progress=tick)
    except (ManifestError, EnvError) as exc:
        fail(str(exc))
    table = Table(title=escape(f"Split manifests in {splits_dir}"))
    for col in ("manifest", "rows", "train", "eval", "checksums"):
        table.add_column(col)
    for r in reports:
        table.add_row(escape(r.manifest), str(r.rows), str(r.train), str(r.eval), escape(r.note))
    console.print(table)
    if problems:
        bad = Table(title=f"{len(problems)} problem(s)", title_style="bold red")
        for col in ("manifest", "kind", "detail"):
            bad.add_column(col)
        for p in problems:
            bad.add_row(escape(p.manifest), escape(p.kind), escape(p.detail))
        console.print(bad)
        raise typer.Exit(1)
    console.print("[green]all manifests verified[/]")
