"""Repeated JSON keys are found whether or not the message's strings hold a colon."""

from __future__ import annotations

import orjson
import pytest

from kernelstream.schemas.codec import check_unique_keys
from kernelstream.schemas.errors import SchemaError


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":1,"b":[1,2],"a":2}',  # no colon in a string: the colon count finds it
        b'{"a":"x:y","b":1,"a":2}',  # a colon in a string: the key scan finds it
        b'{"a" : 1, "b":{"c":1,"c":2}}',  # one level down, with whitespace before a colon
        b'{"a":[{"c":1},{"c":1,"c":2}]}',  # in a list of objects
        b'{"a":{"b":{"c":1,"c":2}}}',  # deeper than counted: the text is parsed again
        # compact, a colon in a string: counting '":' finds it
        b'{"id":"n:0/k","a":1,"a":2}',
        # an escaped quote before a colon in a string counts as a key end: the scan decides
        b'{"s":"say \\":\\"","a":1,"a":2}',
        # one key compact, its repeat with whitespace before its colon
        b'{"id":"n:0","a":1,"a" :2}',
        # what orjson writes of the objects parsed, but for the repeated key
        orjson.dumps({"id": "n:0/k", "e": {"x": 1.5}})[:-1] + b',"id":"n:1/k"}',
        # the same past 4 KiB, where the keys are counted before the text is written back
        orjson.dumps({"id": "n:0/k", "pad": "x" * 5000})[:-1] + b',"id":"n:1/k"}',
    ],
)
def test_a_repeated_key_is_refused(text: bytes) -> None:
    with pytest.raises(SchemaError) as got:
        check_unique_keys(text, orjson.loads(text))
    assert got.value.code == "duplicate_key"


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":1,"b":[1,2],"c":{"d":1}}',
        b'{"a":"x:y","b":"::","c":[{"d":1},{"d":2}]}',  # colons in strings, same key in two objects
        b'{"a" :1, "b"\n:2}',
        b'{"a":{"b":{"c":1}}}',
        b'{"id":"n:0/k","s":"x: y","c":{"d":1}}',  # compact, colons in strings
        b'{"s":"say \\":\\"","a":1}',  # an escaped quote before a colon
        # exactly what orjson writes of the objects parsed, colons in strings
        orjson.dumps({"id": "n:0/k", "e": {"x": 1.5, "s": "a: b"}, "l": [{"k": 1}]}),
        # the same past 4 KiB (the keys counted first, then the text written back)
        orjson.dumps({"id": "n:0/k", "pad": "a: b" * 1500, "l": [{"k": 1}]}),
    ],
)
def test_unique_keys_pass(text: bytes) -> None:
    check_unique_keys(text, orjson.loads(text))
