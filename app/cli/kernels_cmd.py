"""``kernelstream kernels check``: compile workloads (built-in ones and users' own kernels)
with NVRTC and print their resources."""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

if TYPE_CHECKING:
    from kernelstream.kernels.check import Checkable

__all__ = ["kernels"]


@click.group()
def kernels() -> None:
    """The CUDA kernels: compile checks and resource usage (no GPU needed)."""


def _line(row: object, width: int) -> str:
    from kernelstream.kernels.check import CheckRow

    assert isinstance(row, CheckRow)
    r = row.result
    if not r.ok:
        return f"{row.workload.name:<{width}} {row.arch:<6} FAILED  {row.config_id}"
    occ = "-" if row.occupancy is None else f"{row.occupancy:4.0%}"
    return (
        f"{row.workload.name:<{width}} {row.arch:<6} ok {r.registers:>5} "
        f"{r.static_smem_bytes:>7} {r.spills:>6} {r.local_bytes:>6} {occ:>5}  {row.config_id}"
    )


def _user_workloads(specs: Sequence[str], arch: str) -> list[Checkable]:
    """The workloads of the user's kernels ``specs`` name, imported so that a kernel made
    without a device is made on a compile device (no GPU needed)."""
    from kernelstream.app.cli.user_kernels import KernelSpecError, load_kernels
    from kernelstream.kernels.backends.user import compile_device
    from kernelstream.kernels.errors import BackendUnavailableError
    from kernelstream.kernels.tunable import default_device

    found: list[Checkable] = []
    with default_device(compile_device(arch)):
        for spec in specs:
            try:
                found += [k.workload for k in load_kernels(spec)]
            except KernelSpecError:
                raise
            except Exception as ex:  # the user's module failed: say where, never a traceback
                hint = (
                    " (a kernel made with device=cupy_device() needs a GPU: made without "
                    "device=, it is checked on any machine)"
                    if isinstance(ex, BackendUnavailableError) and "CuPy" in str(ex)
                    else ""
                )
                raise click.ClickException(
                    f"--kernel {spec}: importing it raised {type(ex).__name__}: {ex}{hint}"
                ) from ex
    return found


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
    "--workload",
    "names",
    multiple=True,
    help="Built-in workload (repeatable; default all, or none when --kernel is given).",
)
@click.option(
    "--kernel",
    "specs",
    multiple=True,
    metavar="MODULE[:ATTR]",
    help="Your own TunableKernel: module:attribute or file.py:attribute, or a module or "
    "file for every TunableKernel it defines (repeatable). Kernels made without a device "
    "are made on compile_device: no GPU needed.",
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
    specs: tuple[str, ...],
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
    from kernelstream.kernels.workloads.base import CudaWorkload

    try:
        builtin = names if names or specs else WORKLOAD_NAMES  # --kernel alone: only those
        workloads: list[Checkable] = [get_workload(n) for n in builtin]
        workloads += _user_workloads(specs, archs[0]) if specs else []
        width = max(10, *(len(w.name) for w in workloads))
        on = ", ".join(f"{a} {getattr(device_for_arch(a), 'name', 'no known GPU')}" for a in archs)
        click.echo(f"occupancy (theoretical) on: {on}")
        click.echo(
            f"{'workload':<{width}} {'arch':<6} st  regs    smem spills  local   occ  config"
        )
        rows = check_workloads(
            workloads,
            archs,
            sample=sample,
            every=every,
            cache_dir=cache_dir,
            progress=lambda row: click.echo(_line(row, width)),
        )
    except (KernelsError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    doc = report_document(rows)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    if table_path is not None:
        table = table_document(  # the built-ins' table: users' kernels are compiled anew
            (r.workload, r.arch, r.config, r.result)
            for r in rows
            if isinstance(r.workload, CudaWorkload)
        )
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
