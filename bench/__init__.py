"""Benchmarks of kernelstream; results recorded under bench/results/ with the date."""
