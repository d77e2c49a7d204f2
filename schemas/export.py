"""Write the JSON Schema file of every record type: ``python -m kernelstream.schemas.export``."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from kernelstream.schemas.records import RECORD_TYPES

__all__ = ["SCHEMA_DIR", "json_schema_of", "main", "schema_filename"]

SCHEMA_DIR = Path(__file__).with_name("json")


def schema_filename(schema: str) -> str:
    """``ks.launch_batch/1`` -> ``ks.launch_batch.v1.schema.json``."""
    name, version = schema.split("/")
    return f"{name}.v{version}.schema.json"


def json_schema_of(schema: str) -> bytes:
    cls = RECORD_TYPES[schema]
    doc = cls.model_json_schema(by_alias=True)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["$id"] = f"https://kernelstream.dev/schemas/{schema_filename(schema)}"
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def main() -> int:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for schema in RECORD_TYPES:
        (SCHEMA_DIR / schema_filename(schema)).write_bytes(json_schema_of(schema))
    return 0


if __name__ == "__main__":
    sys.exit(main())
