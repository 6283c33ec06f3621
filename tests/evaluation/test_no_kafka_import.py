"""The offline replay and the metrics run without a broker, so importing them loads no Kafka client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KAFKA_PACKAGES = ("aiokafka", "kafka", "faust")

# a fresh interpreter: this test process has already imported the Kafka clients for other tests
PROBE = """
import json, sys
import {module}
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("module", ["mnemoflow.evaluation.metrics", "mnemoflow.evaluation.offline"])
def test_module_imports_no_kafka_client(module: str) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)],
                         capture_output=True, text=True, check=True).stdout
    modules = json.loads(out.strip().splitlines()[-1])
    assert module in modules, "the probe must list the module it imported"
    kafka = sorted(m for m in modules if m.split(".")[0] in KAFKA_PACKAGES)
    assert not kafka, kafka
