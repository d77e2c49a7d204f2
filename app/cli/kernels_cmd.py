"""``kernelstream kernels check``: compile workloads with NVRTC and print their resources."""

from __future__ import annotations

import gzip
from pathlib import Path

import click
import orjson

__all__ = ["kernels"]


@click.group()
def kernels() -> None:
    """The CUDA kernels: compile checks and resource usage (no GPU needed)."""


def _line(row: object) -> str:
    from kernelstream.kernels.check import CheckRow

    assert isinstance(row, CheckRow)
    r = row.result
    if not r.ok:
        return f"{row.workload.name:<10} {row.arch:<6} FAILED  {row.config_id}"
    occ = "-" if row.occupancy is None else f"{row.occupancy:4.0%}"
    return (
        f"{row.workload.name:<10} {row.arch:<6} ok {r.registers:>5} {r.static_smem_bytes:>7} "
        f"{r.spills:>6} {r.local_bytes:>6} {occ:>5}  {row.config_id}"
    )


@kernels.command()
@click.option(
    "--arch",
    "archs",
    multiple=True,
    default=("sm_80", "sm_90"),
    show_default=True,
    help="GPU architecture to compile for (repeatable).",
)
@click.option(
    "--workload", "names", multiple=True, help="Built-in workload (repeatable; default all)."
)
@click.option(
    "--sample",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Configurations per workload: the default and a spread of the space.",
)
@click.option("--all", "every", is_flag=True, help="Every configuration of each space.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every row (with compiler logs) as JSON.",
)
@click.option(
    "--table",
    "table_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the resource table the sim model reads (kernels/cuda/resources.json.gz).",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Compile cache (default ~/.cache/kernelstream/compile).",
)
def check(
    archs: tuple[str, ...],
    names: tuple[str, ...],
    sample: int,
    every: bool,
    json_path: Path | None,
    table_path: Path | None,
    cache_dir: Path | None,
) -> None:
    """Compile each workload's sampled configurations; print registers per thread, static
    shared memory and spills (bytes), stack frame (local bytes) and theoretical occupancy.
    Exits 1 when any configuration fails to compile, after printing its compiler log."""
    from kernelstream.kernels import WORKLOAD_NAMES, get_workload
    from kernelstream.kernels.check import check_workloads, device_for_arch, report_document
    from kernelstream.kernels.errors import KernelsError
    from kernelstream.kernels.resources import table_document

    try:
        workloads = [get_workload(n) for n in (names or WORKLOAD_NAMES)]
        on = ", ".join(f"{a} {getattr(device_for_arch(a), 'name', 'no known GPU')}" for a in archs)
        click.echo(f"occupancy (theoretical) on: {on}")
        click.echo(f"{'workload':<10} {'arch':<6} st  regs    smem spills  local   occ  config")
        rows = check_workloads(
            workloads,
            archs,
            sample=sample,
            every=every,
            cache_dir=cache_dir,
            progress=lambda row: click.echo(_line(row)),
        )
    except (KernelsError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    doc = report_document(rows)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    if table_path is not None:
        table = table_document((r.workload, r.arch, r.config, r.result) for r in rows)
        table_path.write_bytes(
            gzip.compress(orjson.dumps(table, option=orjson.OPT_SORT_KEYS), mtime=0)
        )
    failed = [r for r in rows if not r.result.ok]
    for r in failed:
        click.echo(
            f"\n{r.workload.name} {r.arch} {r.config_id}: compile failed\n{r.result.log}", err=True
        )
    click.echo(f"{doc['compiler']}: {len(rows)} compiled, {len(failed)} failed")
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(rows)} configurations failed to compile")
