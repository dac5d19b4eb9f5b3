"""The Kafka quick starts' ``consumer.py``, started the way their pages say: ``python
consumer.py``.

The docs test runs each page's producer block with the same consumer in-process (``stop=``);
this runs the file itself as the long-lived process a user starts, against a broker of its
own: a retried send is charged once, and SIGTERM stops it after it committed both copies.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from ._services import private_kafka, require
from ._wait import wait_until
from .consumers.conftest import committed, produce
from .test_docs import _KAFKA, ROOT, Block, parse_blocks, worker_process

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

PAGES = ["README.md", "docs/consumers.md"]


def kafka_consumer_file(page: str) -> Block:
    """The page's ``# doc: file consumer.py`` block that consumes Kafka."""
    path = ROOT / page
    found = [b for b in parse_blocks(path, path.read_text())
             if b.file == "consumer.py" and "KafkaConsumerLoop(" in b.code]
    assert len(found) == 1, f"{page}: expected one Kafka consumer.py, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("page", PAGES)
def test_consumer_py_charges_a_retried_send_once(page: str, tmp_path: Path) -> None:
    require("postgres")
    block = kafka_consumer_file(page)
    with private_kafka(tmp_path.parent / f"{tmp_path.name}-tansu.log") as bootstrap:
        (tmp_path / "consumer.py").write_text(_KAFKA.sub(bootstrap, block.code))
        with worker_process(block, "python consumer.py", tmp_path) as worker:
            key = str(uuid.uuid4())
            order = {"value": json.dumps({"customer": "acme", "amount": 100}).encode(),
                     "headers": {"idempotency-key": key, "idempotency-tenant": "acme"},
                     "partition": 0}  # both on one partition, whose offsets tell when both ran
            produce(bootstrap, "orders", [order, order])  # a retried send
            # polled twice a second: each probe is a new Kafka client
            wait_until(lambda: committed(bootstrap, "charger", "orders") == [2],
                       "consumer.py to commit both copies", 60, poll=0.5)
    assert worker.output.count("charging acme 100") == 1, worker.output
    assert worker.returncode == 0, worker.output  # SIGTERM: a clean stop, not a kill
