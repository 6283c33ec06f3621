"""Kafka wiring: config, topic catalogue, local broker, faust worker, host SDK, CLI."""
