"""G-04 replay evaluation: benchmarks replayed as real host traffic, metrics from the topics."""
