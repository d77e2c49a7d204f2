"""SearchSpace enumeration: a listed (measured) space enumerates its points, not the product."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from kernelstream.kernels.space import Config, Constraint, ParamValue, SearchSpace


def _every(params: dict[str, Sequence[ParamValue]]) -> list[Config]:
    return [dict(zip(params, v, strict=True)) for v in itertools.product(*params.values())]


def _product_order(space: SearchSpace) -> list[Config]:
    out: list[Config] = []
    for values in itertools.product(*space.params.values()):
        config = dict(zip(space.params, values, strict=True))
        if space.is_valid(config):
            out.append(config)
    return out


def test_listed_space_enumerates_its_points_in_declared_order() -> None:
    params: dict[str, Sequence[ParamValue]] = {
        "b": [32, 64, 128, 256],
        "t": [1, 2, 4],
        "mode": ["a", "b"],
        "f": [0.5, 1.0],
    }
    every = _every(params)
    probe = SearchSpace("s", params, default=every[0])
    listed = frozenset(probe.config_id(c) for c in every[::3]) | {"b=9,t=1,mode=a,f=0.5", "x"}
    space = SearchSpace(
        "s",
        params,
        default=every[0],
        constraints=(Constraint("b*t <= 512", lambda c: int(c["b"]) * int(c["t"]) <= 512),),
        allowed=listed,
    )
    got = list(space)
    # Read off the ids, without the product, in the product's order, constraints applied;
    # ids that are not points of the space ("b=9", "x") are not valid either way.
    assert space._allowed_points is not None
    assert got == _product_order(space)
    assert got and all(space.is_valid(c) for c in got)
    assert {type(c["f"]) for c in got} == {float} and space.size() == len(got)
    got[0]["b"] = 999  # callers get their own dicts
    assert next(iter(space))["b"] != 999


def test_ids_that_cannot_be_read_back_enumerate_the_product() -> None:
    # 1 and "1" print alike; "x,y" holds the id separator.
    cases: list[dict[str, Sequence[ParamValue]]] = [
        {"a": [1, "1"], "b": [0, 1]},
        {"a": ["x,y", "z"], "b": [0, 1]},
    ]
    for params in cases:
        every = _every(params)
        probe = SearchSpace("s", params, default=every[0])
        space = SearchSpace(
            "s", params, default=every[0], allowed=frozenset(probe.config_id(c) for c in every)
        )
        assert space._allowed_points is None
        assert list(space) == _product_order(space) == every


def test_a_replaced_list_is_read_anew() -> None:
    import dataclasses

    params: dict[str, Sequence[ParamValue]] = {"a": [1, 2, 3], "b": [0, 1]}
    every = _every(params)
    probe = SearchSpace("s", params, default=every[0])
    ids = [probe.config_id(c) for c in every]
    one = SearchSpace("s", params, default=every[0], allowed=frozenset(ids[:2]))
    assert len(list(one)) == 2  # its points are read and kept
    # The resolver merges the lists of two files of one kernel this way.
    both = dataclasses.replace(one, allowed=frozenset(ids))
    assert list(both) == every


@pytest.mark.parametrize(
    "space",
    [
        SearchSpace("flags", {"x": (1, True, 2), "y": (False, True, 0)}, {"x": 1, "y": False}),
        SearchSpace(
            "constraints",
            {"x": (1, 2, 3), "y": ("a", "b")},
            {"x": 1, "y": "a"},
            constraints=(
                Constraint("x < 3", lambda c: c["x"] in (1, 2)),
                Constraint("y != b", lambda c: c["y"] != "b"),
            ),
        ),
        SearchSpace(
            "broken constraint", {"x": (1, 2)}, {"x": 1}, (Constraint("z", lambda c: c["z"] == 1),)
        ),
        SearchSpace(
            "ids read back",
            {"x": (1, 2, 3), "y": (1.5, 2.5)},
            {"x": 1, "y": 1.5},
            allowed=frozenset({"x=1,y=1.5", "x=3,y=2.5", "x=9,y=1"}),
        ),
        SearchSpace(
            "ids that print alike",
            {"x": ("1", "1.0", 1), "y": (1,)},
            {"x": "1", "y": 1},
            allowed=frozenset({"x=1,y=1"}),
        ),
    ],
    ids=lambda s: s.name,
)
def test_enumeration_is_every_valid_product_point_in_order(space: SearchSpace) -> None:
    """A declared space's values are checked once each, not once per configuration: the
    configurations are still exactly those of the product that is_valid passes, in order."""
    assert list(space) == _product_order(space)
