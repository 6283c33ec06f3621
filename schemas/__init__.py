"""Avro schemas (one .avsc per topic value) and the single-object codec."""
