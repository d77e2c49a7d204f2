"""Record types of kernelstream's topics, their JSON Schemas and the wire codec."""

from kernelstream.schemas.codec import MAX_MESSAGE_BYTES, decode, decode_any, encode
from kernelstream.schemas.errors import KernelstreamError, SchemaError, SigningKeyError
from kernelstream.schemas.records import (
    RECORD_TYPES,
    Alert,
    DeadLetter,
    DeviceSample,
    Finding,
    LaunchBatch,
    Recommendation,
    ReconfigOutcome,
    Record,
    WindowAggregate,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "RECORD_TYPES",
    "Alert",
    "DeadLetter",
    "DeviceSample",
    "Finding",
    "KernelstreamError",
    "LaunchBatch",
    "Recommendation",
    "ReconfigOutcome",
    "Record",
    "SchemaError",
    "SigningKeyError",
    "WindowAggregate",
    "decode",
    "decode_any",
    "encode",
]
