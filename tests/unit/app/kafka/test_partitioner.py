"""The cached partitioner puts every key where aiokafka's default (Java's murmur2) does."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner

from kernelstream.app.kafka.partitioner import CachedKeyPartitioner


def test_same_partition_as_the_default_for_every_key_and_partition_count() -> None:
    rng = random.Random(0)
    keys = [rng.randbytes(rng.randint(0, 64)) for _ in range(500)]
    keys += [f"node-{i:03d}:0/matmul".encode() for i in range(100)]
    cached, default = CachedKeyPartitioner(max_keys=50), DefaultPartitioner()
    for _ in range(2):  # the second pass answers from the cache (and its clears)
        for n in (1, 2, 3, 4, 7, 12, 64):
            parts = list(range(n))
            for k in keys:
                assert cached(k, parts, parts) == default(k, parts, parts)


def test_a_topic_that_grows_is_partitioned_by_its_new_count() -> None:
    cached, default = CachedKeyPartitioner(), DefaultPartitioner()
    key = b"node-a:0/transpose"
    for n in (4, 8, 4):
        parts = list(range(n))
        assert cached(key, parts, parts) == default(key, parts, parts)


def test_no_key_goes_to_some_available_partition() -> None:
    cached = CachedKeyPartitioner()
    assert {cached(None, [0, 1, 2], [1]) for _ in range(20)} == {1}
    assert cached(None, [0, 1, 2], []) in {0, 1, 2}


def test_the_cache_is_bounded() -> None:
    cached = CachedKeyPartitioner(max_keys=10)
    for i in range(100):
        cached(str(i).encode(), [0, 1], [0, 1])
    assert len(cached._hash) <= 10
