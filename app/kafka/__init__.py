"""Kafka plumbing shared by workers, nodes and tools: the embedded broker, topic
definitions, the key partitioner and the faster zstd decompression."""
