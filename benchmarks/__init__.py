"""Benchmarks for the dataloader_iter designs (issue 7); see README.md."""
