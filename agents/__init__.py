"""Pure stages: each is (state, input) -> (state, outputs); no Kafka, no I/O."""
