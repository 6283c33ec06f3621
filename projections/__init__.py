"""Projections of the memory-log: LanceDB index, MEMORY.md, embeddings."""
