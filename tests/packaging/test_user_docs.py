"""What a new user copies first: the README's quick starts and the examples, as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ..test_docs import parse_blocks

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _section_blocks(heading: str) -> list[str]:
    text = README.read_text()
    section = text.split(heading + "\n", 1)[1]
    section = re.split(r"^##+ ", section, maxsplit=1, flags=re.M)[0]
    return [b.code for b in parse_blocks(README, section) if b.language == "python"]


def test_the_core_quick_start_runs_twice_in_a_row(tmp_path: Path) -> None:
    """Its SQLite file keeps the first run's record; the second run is a new operation."""
    code = _section_blocks("## Quick start (core)")[0]
    assert "sqlite:///idempotency.db" in code
    for run in (1, 2):
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, f"run {run}: {proc.stderr}"
    assert (tmp_path / "idempotency.db").is_file()


def _undefined_names(code: str, tmp_path: Path) -> str:
    path = tmp_path / "block.py"
    path.write_text(code)
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F",
         "--output-format", "concise", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    return proc.stdout if proc.returncode else ""


def test_the_kafka_quick_start_defines_every_name_and_shows_a_producer(tmp_path: Path) -> None:
    consumer, producer = _section_blocks("### Kafka and RabbitMQ consumers")
    assert _undefined_names(consumer, tmp_path) == ""
    assert _undefined_names(producer, tmp_path) == ""
    assert "KafkaConsumerLoop(" in consumer and "class InvalidOrder" in consumer
    assert "Producer(" in producer and '"idempotency-key": key' in producer
    assert re.search(r"key = str\(uuid\.uuid4\(\)\)\nfor ", producer)  # made once, reused


def test_the_undefined_name_check_can_fail(tmp_path: Path) -> None:
    assert "F821" in _undefined_names("charge(payments)\n", tmp_path)


def _example(name: str) -> types.ModuleType:
    path = ROOT / "examples" / f"{name}.py"
    module = types.ModuleType(f"example_{name}")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


class _Producer:
    """Stands in for confluent-kafka's Producer (no broker needed to see what it sends)."""

    sent: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def produce(self, topic: str, **kwargs: Any) -> None:
        _Producer.sent.append({"topic": topic, **kwargs})

    def flush(self, timeout: float) -> int:
        return 0


def test_the_two_consumer_examples_never_replay_each_others_orders(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both default to the same store and order numbers: their scopes must differ (their
    own operation), and a second run of a producer sends new orders (new keys)."""
    kafka, rabbitmq = _example("kafka_consumer"), _example("rabbitmq_consumer")
    assert kafka.OPERATION != rabbitmq.OPERATION
    assert kafka.STORE_URL == rabbitmq.STORE_URL  # the very case this guards
    for module in (kafka, rabbitmq):
        source = Path(module.__file__ or "").read_text()
        assert "operation=OPERATION" in source and '"orders.charge"' not in source

    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Producer", _Producer)
    _Producer.sent.clear()
    kafka.produce()
    first = [m["headers"]["idempotency-key"] for m in _Producer.sent]
    _Producer.sent.clear()
    kafka.produce()
    second = [m["headers"]["idempotency-key"] for m in _Producer.sent]
    capsys.readouterr()
    assert len(set(first)) == 3 and len(first) == 5  # two duplicates within a run
    assert not set(first) & set(second)
    assert all(json.loads(m["value"])["customer"] for m in _Producer.sent)


def test_gitignore_hides_no_committed_file() -> None:
    proc = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    assert proc.stdout == ""
    tracked = subprocess.run(["git", "ls-files", "examples"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60).stdout.split()
    assert tracked
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *tracked], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert ignored.stdout == ""
