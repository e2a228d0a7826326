"""Benchmarks (``make bench``): each prints its figure beside a baseline measured in the same run
and records the numbers in bench/results/<name>.json; docs/benchmarks.md keeps the history."""
