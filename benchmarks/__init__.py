"""Benchmarks for the dataloader_iter designs; see README.md."""
