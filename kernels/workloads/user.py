"""A user's own CUDA kernel as a workload, declared in Kernel Tuner's vocabulary.

``tune_params`` (name -> list of values), ``restrictions`` (Python expressions over the
parameter names, or callables of a config dict), ``grid_div_x/y/z`` and
``block_size_names`` mean what they mean to ``kernel_tuner.tune_kernel``: the thread block
is read from the block-size parameters (x defaults to 256 when it is not tuned, y and z to
1), and the grid is the problem size divided by the product of the ``grid_div`` terms,
rounded up. Every tunable parameter, the block sizes and the grid sizes reach the source as
``-Dname=value``. ``flops``/``bytes`` are callables of the config and the problem size;
without both the launches are not placed on a roofline (never a guess).

>>> w = UserWorkload("vadd", "__global__ void vadd(float *c, const float *a, int n) {}",
...                  1_000_000, {"block_size_x": [64, 128, 256]},
...                  restrictions=["block_size_x >= 128"])
>>> w.arity, w.space.size(), w.default
(3, 2, {'block_size_x': 128})
>>> w.geometry(w.default).grid
(7813, 1, 1)
"""

from __future__ import annotations

import ast
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelstream.kernels.errors import KernelDefinitionError
from kernelstream.kernels.space import Config, Constraint, ParamValue, SearchSpace, SpaceError
from kernelstream.kernels.workloads.base import Geometry, Traits

__all__ = ["CostModel", "Expression", "UserWorkload", "kernel_signature"]

log = logging.getLogger("kernelstream.kernels.user")

CostModel = Callable[[Mapping[str, ParamValue], tuple[int, ...]], float]
Restriction = str | Callable[[Mapping[str, ParamValue]], Any]
GridDiv = Sequence[str] | Callable[[Mapping[str, ParamValue]], Any]

_DEFAULT_BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")
# What Kernel Tuner's restriction strings commonly call; nothing that reaches the system.
_SAFE_BUILTINS: dict[str, Any] = {
    f.__name__: f for f in (abs, all, any, bool, divmod, float, int, len, max, min, pow, round)
} | {"True": True, "False": False, "None": None}


class _UnknownNameError(KeyError):
    """A restriction or grid divisor read a name that is not a tunable parameter."""


class _Probe(dict[str, ParamValue]):
    def __missing__(self, key: str) -> Any:
        raise _UnknownNameError(key)


class Expression:
    """A Python expression over tunable parameter names, checked once, evaluated per config.

    >>> e = Expression("block_size_x * tile", ["block_size_x", "tile"], "grid_div_x")
    >>> e({"block_size_x": 32, "tile": 2})
    64
    """

    def __init__(self, text: str, names: Sequence[str], where: str) -> None:
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as ex:
            raise KernelDefinitionError(
                f"{where}: {text!r} is not a Python expression: {ex.msg}"
            ) from None
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        unknown = sorted(used - set(names) - set(_SAFE_BUILTINS))
        if unknown:
            raise KernelDefinitionError(
                f"{where}: {text!r} names unknown parameter(s) {unknown}; "
                f"the tunable parameters are {list(names)}"
            )
        self.text = text
        self._code = compile(tree, f"<{where}>", "eval")

    def __call__(self, config: Mapping[str, ParamValue]) -> Any:
        return eval(self._code, {"__builtins__": _SAFE_BUILTINS}, dict(config))


def _check_tune_params(name: str, tune_params: Any) -> dict[str, list[ParamValue]]:
    if not isinstance(tune_params, Mapping) or not tune_params:
        raise KernelDefinitionError(
            f"kernel {name!r}: tune_params must be a non-empty dict of parameter name -> "
            f"list of values, got {type(tune_params).__name__}"
        )
    out: dict[str, list[ParamValue]] = {}
    for p, values in tune_params.items():
        if not isinstance(p, str) or not p.isidentifier():
            raise KernelDefinitionError(
                f"kernel {name!r}: tune_params key {p!r} is not a C/Python identifier"
            )
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
            raise KernelDefinitionError(
                f"kernel {name!r}: tune_params[{p!r}] must be a list of values, got "
                f"{type(values).__name__} {values!r} (write [{values!r}] for a single value)"
            )
        if not values:
            raise KernelDefinitionError(f"kernel {name!r}: tune_params[{p!r}] has no values")
        bad = [v for v in values if not isinstance(v, (int, float, str, bool))]
        if bad:
            raise KernelDefinitionError(
                f"kernel {name!r}: tune_params[{p!r}] holds {bad[0]!r}; values must be "
                "numbers, strings or booleans"
            )
        out[p] = list(values)
    return out


def _constraint(r: Restriction, i: int, params: Mapping[str, Sequence[ParamValue]]) -> Constraint:
    where = f"restrictions[{i}]"
    if isinstance(r, str):
        expr = Expression(r, list(params), where)
        return Constraint(r, lambda c: bool(expr(c)))
    if not callable(r):
        raise KernelDefinitionError(
            f"{where}: {r!r} is neither a string expression nor a callable of a config dict"
        )
    probe = _Probe({p: v[0] for p, v in params.items()})
    try:
        r(probe)
    except _UnknownNameError as ex:
        raise KernelDefinitionError(
            f"{where}: {getattr(r, '__name__', r)!r} reads unknown parameter {ex.args[0]!r}; "
            f"the tunable parameters are {list(params)}"
        ) from None
    except Exception:
        pass  # (e.g. a division by a value of 0): the restriction excludes that config
    return Constraint(getattr(r, "__name__", f"restriction {i}"), r)


def _restrictions(
    restrictions: Restriction | Sequence[Restriction] | None,
    params: Mapping[str, Sequence[ParamValue]],
) -> tuple[Constraint, ...]:
    if restrictions is None:
        return ()
    items: list[Restriction] = (
        [restrictions]
        if isinstance(restrictions, str) or callable(restrictions)
        else list(restrictions)
    )
    return tuple(_constraint(r, i, params) for i, r in enumerate(items))


_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_GLOBAL = r"__global__\s+" + _BOUNDS + r"void\s+" + _BOUNDS


def kernel_signature(source: str, name: str) -> tuple[int, str]:
    """(number of parameters, parameter list) of the ``__global__`` function ``name``.

    >>> kernel_signature('extern "C" __global__ void k(float *a, int n) {}', "k")
    (2, 'float *a, int n')
    """
    m = re.search(_GLOBAL + re.escape(name) + r"\s*\(([^)]*)\)", source)
    if m is None:
        raise KernelDefinitionError(
            f"kernel {name!r}: no '__global__ void {name}(...)' in the source; name the "
            'kernel function as it is written there (extern "C", not a template)'
        )
    text = " ".join(m.group(1).split())
    if not text or text == "void":
        return 0, text
    return text.count(",") + 1, text


def _read_source(name: str, source: str | Path) -> tuple[str, Path | None]:
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.endswith((".cu", ".cuh"))
    ):
        path = Path(source)
        try:
            return path.read_text(encoding="utf-8"), path
        except OSError as ex:
            raise KernelDefinitionError(f"kernel {name!r}: cannot read source {path}: {ex}") from ex
    if not isinstance(source, str):
        raise KernelDefinitionError(f"kernel {name!r}: source must be CUDA code or a .cu path")
    return source, None


def _problem_size(name: str, problem_size: Any) -> tuple[int, ...]:
    items = list(problem_size) if isinstance(problem_size, (list, tuple)) else [problem_size]
    if not 1 <= len(items) <= 3 or any(
        isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in items
    ):
        raise KernelDefinitionError(
            f"kernel {name!r}: problem_size {problem_size!r} must be 1 to 3 positive integers"
        )
    return tuple(items)


class UserWorkload:
    """A user kernel (source + problem size + declared space), usable as a :class:`Workload`."""

    def __init__(
        self,
        name: str,
        source: str | Path,
        problem_size: int | Sequence[int],
        tune_params: Mapping[str, Sequence[ParamValue]],
        *,
        restrictions: Restriction | Sequence[Restriction] | None = None,
        grid_div_x: GridDiv | None = None,
        grid_div_y: GridDiv | None = None,
        grid_div_z: GridDiv | None = None,
        block_size_names: Sequence[str] | None = None,
        flops: CostModel | None = None,
        bytes: CostModel | None = None,
        default: Mapping[str, ParamValue] | None = None,
    ) -> None:
        self.name = self.kernel_name = name
        self.code, self.source = _read_source(name, source)
        self.arity, self.signature = kernel_signature(self.code, name)
        self.problem_size = _problem_size(name, problem_size)
        params = _check_tune_params(name, tune_params)
        names = list(block_size_names or _DEFAULT_BLOCK_NAMES)
        self.block_size_names = tuple((names + list(_DEFAULT_BLOCK_NAMES[len(names) :]))[:3])
        divs = (grid_div_x, grid_div_y, grid_div_z)
        self._grid_div = [
            self._divisor(d, self.block_size_names[i], params, f"grid_div_{'xyz'[i]}")
            for i, d in enumerate(divs)
        ]
        self.explicit_default = default is not None
        start = {p: v[0] for p, v in params.items()} | dict(default or {})
        space = SearchSpace(name, params, start, _restrictions(restrictions, params))
        try:
            self._default = space.start_config()
        except SpaceError as ex:
            raise KernelDefinitionError(f"kernel {name!r}: {ex} (check restrictions)") from None
        self._space = space
        self._flops, self._bytes = flops, bytes
        self.cost_model_known = flops is not None and bytes is not None
        self._check_cost_models()

    def __repr__(self) -> str:
        return f"UserWorkload({self.name!r}, problem_size={self.problem_size})"

    @staticmethod
    def _divisor(
        div: GridDiv | None, block_name: str, params: Mapping[str, Any], where: str
    ) -> Callable[[Mapping[str, ParamValue]], Any]:
        if div is None:
            return lambda c: c.get(block_name, 256 if block_name.endswith("x") else 1)
        if callable(div):
            return div
        if isinstance(div, str):
            div = [div]
        exprs = [Expression(str(t), list(params), where) for t in div]
        return lambda c: math.prod(int(e(c)) for e in exprs)

    def _check_cost_models(self) -> None:
        for label, fn in (("flops", self._flops), ("bytes", self._bytes)):
            if fn is None:
                continue
            try:
                value = float(fn(dict(self._default), self.problem_size))
            except Exception as ex:
                raise KernelDefinitionError(
                    f"kernel {self.name!r}: {label}(config, problem_size) failed on "
                    f"{self._space.config_id(self._default)}: {type(ex).__name__}: {ex}"
                ) from ex
            if not math.isfinite(value) or value < 0:
                raise KernelDefinitionError(
                    f"kernel {self.name!r}: {label} returned {value}; it must be a "
                    "finite count >= 0"
                )

    @property
    def space(self) -> SearchSpace:
        return self._space

    def restrict(self, space: SearchSpace, default: Config) -> None:
        """Narrow the declared space (a trace device: to the configurations measured)."""
        self._space, self._default = space, dict(default)

    @property
    def default(self) -> Config:
        return dict(self._default)

    def _cost(self, fn: CostModel | None, config: Mapping[str, ParamValue]) -> float:
        if fn is None:
            return 0.0
        try:
            return max(0.0, float(fn(dict(config), self.problem_size)))
        except Exception as ex:  # the user's model must not stop the node's telemetry
            log.warning("kernel %s: cost model failed on %s: %s", self.name, dict(config), ex)
            return 0.0

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        return self._cost(self._flops, config)

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        return self._cost(self._bytes, config)

    def block(self, config: Mapping[str, ParamValue]) -> tuple[int, int, int]:
        bx, by, bz = self.block_size_names
        return (int(config.get(bx, 256)), int(config.get(by, 1)), int(config.get(bz, 1)))

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        size = (*self.problem_size, 1, 1)[:3]
        grid = tuple(
            max(1, -(-size[i] // max(1, int(self._grid_div[i](config))))) for i in range(3)
        )
        return Geometry((grid[0], grid[1], grid[2]), self.block(config), 0, None)

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        return Traits()

    def defines(self, config: Mapping[str, ParamValue]) -> dict[str, str]:
        """``-D`` macros of ``config``: its parameters, block sizes and grid sizes."""
        geo = self.geometry(config)
        out = {f"grid_size_{a}": str(g) for a, g in zip("xyz", geo.grid, strict=True)}
        out |= {n: str(b) for n, b in zip(self.block_size_names, geo.block, strict=True)}
        out |= {p: str(int(v) if isinstance(v, bool) else v) for p, v in config.items()}
        return out
