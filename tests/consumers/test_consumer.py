"""IdempotentConsumer on MemoryStore: keys, headers, CloudEvents, tenants, every outcome kind,
batch semantics equal to single semantics, and hostile input."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyHandler,
    MemoryStore,
    SQLStore,
    Status,
    current_context,
)
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome
from idempotent_tasks.consumers._message import dead_letter_headers, header_text
from idempotent_tasks.consumers._resolve import cloudevents_key
from idempotent_tasks.testing import FakeClock, FaultyStore
from tests._claims import claimed


class ValidationError(Exception):
    pass


class Flaky(Exception):
    pass


def make(store: Any = None, clock: FakeClock | None = None, **kwargs: Any) -> IdempotentConsumer:
    handler = IdempotencyHandler(
        store if store is not None else MemoryStore(), metrics=None,
        clock=clock or FakeClock(), lease_timeout=30, outcome_retry_timeout=0.05,
    )
    kwargs.setdefault("default_tenant", "acme")
    kwargs.setdefault("permanent", (ValidationError,))
    return IdempotentConsumer(handler, operation="orders.created", **kwargs)


def msg(value: Any = None, key: str | None = "k-1", **headers: Any) -> Message:
    hdrs = {"idempotency-key": key} if key is not None else {}
    hdrs.update(headers)
    body = json.dumps(value if value is not None else {"n": 1}).encode()
    return Message(body, hdrs, topic="orders", partition=0, offset=7)


class Recorder:
    """A body that counts its runs per payload and can fail on demand."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.fail_with: dict[str, list[BaseException]] = {}

    def __call__(self, payload: Any) -> Any:
        name = json.dumps(payload, sort_keys=True)
        self.runs[name] += 1
        errors = self.fail_with.get(name)
        if errors:
            raise errors.pop(0)
        return {"ok": payload}


# --------------------------------------------------------------------------- keys & headers
@pytest.mark.parametrize(
    "header", ["idempotency-key", "idempotency_key", "Idempotency-Key", "IDEMPOTENCY_KEY"]
)
def test_key_header_is_case_insensitive_and_accepts_dash_or_underscore(header: str) -> None:
    consumer = make()
    body = Recorder()
    first = consumer.process(Message(b'{"a":1}', {header: "abc"}), body)
    second = consumer.process(Message(b'{"a":1}', {"idempotency-key": "abc"}), body)
    assert (first.kind, second.kind) == ("executed", "replayed")
    assert first.key == "abc" and second.result == first.result == {"ok": {"a": 1}}
    assert sum(body.runs.values()) == 1


def test_duplicates_replay_the_stored_result_and_never_rerun() -> None:
    consumer = make()
    body = Recorder()
    outcomes = [consumer.process(msg({"amount": 5}), body) for _ in range(5)]
    assert [o.kind for o in outcomes] == ["executed"] + ["replayed"] * 4
    assert all(o.result == {"ok": {"amount": 5}} for o in outcomes)
    assert all(o.error_code is None and o.settled and not o.dead_letter for o in outcomes)
    assert sum(body.runs.values()) == 1


def test_cloudevents_binary_mode_kafka_and_amqp_headers() -> None:
    consumer = make(key=None)
    body = Recorder()
    kafka = Message(b'{"x":1}', {"ce_source": "/shop", "ce_id": "e-1", "ce_type": "t"})
    amqp = Message(b'{"x":1}', {"cloudEvents:source": "/shop", "cloudEvents:id": "e-1"})
    other_id = Message(b'{"x":1}', {"ce_source": "/shop", "ce_id": "e-2"})
    a, b, c = (consumer.process(m, body) for m in (kafka, amqp, other_id))
    assert (a.kind, b.kind, c.kind) == ("executed", "replayed", "executed")
    assert a.key == cloudevents_key("/shop", "e-1") == b.key
    assert sum(body.runs.values()) == 2


def test_cloudevents_structured_mode_key_from_envelope_payload_is_data() -> None:
    consumer = make()
    seen: list[Any] = []
    envelope = {"specversion": "1.0", "id": "e-9", "source": "/billing", "type": "paid",
                "data": {"invoice": 42}}
    m1 = Message(json.dumps(envelope).encode(), None,
                 content_type="application/cloudevents+json")
    envelope2 = dict(envelope, time="2024-01-01T00:00:00Z")  # re-sent: same id, same data
    m2 = Message(json.dumps(envelope2).encode(),
                 {"Content-Type": "application/cloudevents+json; charset=utf-8"})
    def body(result: str) -> Any:
        def run(payload: Any) -> str:
            seen.append(payload)
            return result
        return run

    o1 = consumer.process(m1, body("done"))
    o2 = consumer.process(m2, body("again"))
    assert seen == [{"invoice": 42}]
    assert (o1.kind, o2.kind, o2.result) == ("executed", "replayed", "done")
    assert o1.key == cloudevents_key("/billing", "e-9")


def test_cloudevents_keys_cannot_collide_across_source_and_id_boundaries() -> None:
    consumer = make()
    body = Recorder()
    a = consumer.process(Message(b"1", {"ce_source": "a/b", "ce_id": "c"}), body)
    b = consumer.process(Message(b"1", {"ce_source": "a", "ce_id": "/bc"}), body)
    assert (a.kind, b.kind) == ("executed", "executed") and a.key != b.key


def test_explicit_key_header_wins_over_cloudevents_id() -> None:
    consumer = make()
    m = Message(b"1", {"idempotency-key": "explicit", "ce_source": "/s", "ce_id": "1"})
    assert consumer.process(m, lambda p: p).key == "explicit"


def test_structured_cloudevent_without_id_is_rejected_missing_key() -> None:
    consumer = make()
    bad = Message(b'{"source": "/s", "data": 1}', None,
                  content_type="application/cloudevents+json")
    out = consumer.process(bad, lambda p: p)
    assert (out.kind, out.error_code) == ("rejected", ErrorCode.MISSING_KEY)
    not_object = Message(b"[1]", None, content_type="application/cloudevents+json")
    assert consumer.process(not_object, lambda p: p).error_code == ErrorCode.INVALID_PAYLOAD


def test_coordinates_key_is_opt_in() -> None:
    body = Recorder()
    consumer = make(key="coordinates")
    m = Message(b'{"a":1}', None, topic="t", partition=3, offset=11)
    again = Message(b'{"a":1}', None, topic="t", partition=3, offset=11)
    moved = Message(b'{"a":1}', None, topic="t", partition=3, offset=12)
    outs = [consumer.process(x, body) for x in (m, again, moved)]
    assert [o.kind for o in outs] == ["executed", "replayed", "executed"]
    assert outs[0].key == "t/3/11"
    amqp = consumer.process(Message(b"1", None, message_id="mid-1"), body)
    assert amqp.key == "mid-1"
    nothing = consumer.process(Message(b"1", None), body)
    assert (nothing.kind, nothing.error_code) == ("rejected", ErrorCode.MISSING_KEY)
    # without the opt-in, coordinates are never a key
    assert make().process(Message(b"1", None, topic="t", partition=0, offset=1), body).error_code \
        == ErrorCode.MISSING_KEY


def test_key_function_and_its_failures() -> None:
    consumer = make(key=lambda m: m.headers["order"])
    assert consumer.process(Message(b"1", {"order": "o-1"}), lambda p: p).key == "o-1"
    missing = consumer.process(Message(b"1", {}), lambda p: p)
    assert (missing.kind, missing.error_code) == ("rejected", ErrorCode.MISSING_KEY)
    broken = make(key=lambda m: 1 / 0)
    assert broken.process(Message(b"1", {}), lambda p: p).error_code == ErrorCode.INVALID_KEY
    with pytest.raises(ConfigurationError):
        make(key="offset")


# --------------------------------------------------------------------------- tenants
def test_tenant_precedence_function_then_header_then_default() -> None:
    fn = make(tenant=lambda m: "from-fn")
    assert fn.process(msg(**{"idempotency-tenant": "hdr"}), lambda p: p).tenant == "from-fn"
    hdr = make()
    assert hdr.process(msg(**{"Idempotency_Tenant": "hdr"}), lambda p: p).tenant == "hdr"
    assert hdr.process(msg(), lambda p: p).tenant == "acme"


def test_missing_tenant_is_rejected_never_defaulted() -> None:
    consumer = make(default_tenant=None)
    body = Recorder()
    out = consumer.process(msg(), body)
    assert (out.kind, out.error_code) == ("rejected", ErrorCode.MISSING_TENANT)
    assert out.dead_letter and out.settled and not body.runs
    via_fn = make(default_tenant=None, tenant=lambda m: m.headers["tenant"])
    assert via_fn.process(msg(), body).error_code == ErrorCode.MISSING_TENANT


def test_same_key_in_two_tenants_runs_twice() -> None:
    consumer = make()
    body = Recorder()
    a = consumer.process(msg(**{"idempotency-tenant": "t1"}), body)
    b = consumer.process(msg(**{"idempotency-tenant": "t2"}), body)
    assert (a.kind, b.kind) == ("executed", "executed")
    assert sum(body.runs.values()) == 2


# --------------------------------------------------------------------------- outcome kinds
def test_key_reused_with_another_payload_is_rejected() -> None:
    consumer = make()
    consumer.process(msg({"a": 1}), lambda p: p)
    out = consumer.process(msg({"a": 2}), lambda p: pytest.fail("must not run"))
    assert (out.kind, out.error_code) == ("rejected", ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST)


def test_in_progress_while_the_first_delivery_runs() -> None:
    consumer = make()
    started, release = threading.Event(), threading.Event()
    results: list[Outcome] = []

    def slow(payload: Any) -> str:
        started.set()
        assert release.wait(10)
        return "first"

    t = threading.Thread(target=lambda: results.append(consumer.process(msg(), slow)))
    t.start()
    assert started.wait(10)
    dup = consumer.process(msg(), lambda p: pytest.fail("must not run"))
    release.set()
    t.join(10)
    assert (dup.kind, dup.error_code) == ("in_progress", ErrorCode.REQUEST_IN_PROGRESS)
    assert dup.retry and not dup.settled
    assert results[0].kind == "executed"
    assert consumer.process(msg(), slow).result == "first"


def test_transient_failure_is_counted_then_retried_then_poisoned() -> None:
    consumer = make(max_retries=3)
    body = Recorder()
    body.fail_with['{"n": 1}'] = [Flaky("a"), Flaky("b"), Flaky("c")]
    outs = [consumer.process(msg(), body) for _ in range(4)]
    assert [o.kind for o in outs] == ["failed", "failed", "poisoned", "poisoned"]
    assert outs[0].error == "Flaky" and outs[0].retry and outs[0].error_code is None
    assert outs[2].error_code == ErrorCode.REQUEST_FAILED and outs[2].error == "Flaky"
    assert outs[3].error_code == ErrorCode.REQUEST_FAILED and outs[3].error is None
    # the counter after each attempt; the poisoned duplicate reports the scope's counter
    assert [o.retry_count for o in outs] == [1, 2, 3, 3] and body.runs['{"n": 1}'] == 3
    record = consumer.handler.get_record(operation="orders.created", tenant="acme", key="k-1")
    assert record is not None and record.retry_count == 3


def test_failed_then_succeeds_on_redelivery() -> None:
    consumer = make()
    body = Recorder()
    body.fail_with['{"n": 1}'] = [Flaky()]
    assert consumer.process(msg(), body).kind == "failed"
    assert consumer.process(msg(), body).kind == "executed"
    assert consumer.process(msg(), body).kind == "replayed"


def test_permanent_error_poisons_with_request_failed_and_class_name() -> None:
    consumer = make()
    body = Recorder()
    body.fail_with['{"n": 1}'] = [ValidationError("bad amount")]
    out = consumer.process(msg(), body)
    assert (out.kind, out.error_code, out.error) == ("poisoned", ErrorCode.REQUEST_FAILED,
                                                      "ValidationError")
    assert out.dead_letter and "bad amount" in (out.detail or "")
    again = consumer.process(msg(), body)
    assert (again.kind, again.error_code) == ("poisoned", ErrorCode.REQUEST_FAILED)
    assert body.runs['{"n": 1}'] == 1


def test_permanent_predicate() -> None:
    consumer = make(permanent=lambda exc: isinstance(exc, KeyError))
    missing: dict[str, int] = {}
    assert consumer.process(msg(), lambda p: missing["x"]).kind == "poisoned"


def test_store_down_means_body_not_run_and_not_settled() -> None:
    store = FaultyStore(MemoryStore())
    consumer = make(store)
    store.fail("create")
    body = Recorder()
    out = consumer.process(msg(), body)
    assert (out.kind, out.error_code) == ("store_unavailable", ErrorCode.STORE_UNAVAILABLE)
    assert out.retry and not body.runs
    store.heal()
    assert consumer.process(msg(), body).kind == "executed"


def test_outcome_not_recorded_is_not_settled_and_the_lease_decides() -> None:
    clock = FakeClock()
    store = FaultyStore(MemoryStore())
    consumer = make(store, clock)
    body = Recorder()
    store.fail("mark_success")
    out = consumer.process(msg(), body)
    assert (out.kind, out.error_code) == ("store_unavailable", ErrorCode.OUTCOME_NOT_RECORDED)
    assert out.retry and body.runs['{"n": 1}'] == 1
    store.heal()
    assert consumer.process(msg(), body).kind == "in_progress"  # the lease is still live
    clock.advance(31)
    retaken = consumer.process(msg(), body)
    assert (retaken.kind, retaken.retry_count) == ("executed", 1)


def test_unserialisable_result_poisons() -> None:
    consumer = make()
    out = consumer.process(msg(), lambda p: object())
    assert (out.kind, out.error_code) == ("poisoned", ErrorCode.RESPONSE_NOT_SERIALIZABLE)


def test_crashed_attempt_is_taken_over_after_lease_expiry() -> None:
    clock = FakeClock()
    consumer = make(clock=clock)
    h = consumer.handler
    call = h._engine.prepare("orders.created", "acme", "k-1", {"n": 1}, True)
    assert call is not None and claimed(h, call)  # a worker claimed, then died
    body = Recorder()
    assert consumer.process(msg(), body).kind == "in_progress"
    clock.advance(31)
    out = consumer.process(msg(), body)
    assert (out.kind, out.retry_count) == ("executed", 1)


def test_context_is_bound_inside_the_body() -> None:
    consumer = make()
    seen: list[Any] = []

    def body(payload: Any) -> None:
        ctx = current_context()
        seen.append((ctx.tenant, ctx.operation, ctx.key) if ctx else None)

    consumer.process(msg(), body)
    assert seen == [("acme", "orders.created", "k-1")]


def test_keyboard_interrupt_propagates_after_being_counted() -> None:
    consumer = make()

    def body(payload: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        consumer.process(msg(), body)
    record = consumer.handler.get_record(operation="orders.created", tenant="acme", key="k-1")
    assert record is None  # released for a retry ...
    call = consumer.handler._engine.prepare("orders.created", "acme", "k-1", {"n": 1}, True)
    assert call is not None
    assert consumer.handler._engine.store.get_retry_count(call.scope) == 1  # ... and counted


def test_unkeyed_messages_run_when_keys_are_optional() -> None:
    consumer = make(require_key=False)
    body = Recorder()
    outs = [consumer.process(msg(key=None), body) for _ in range(2)]
    assert [o.kind for o in outs] == ["executed", "executed"]
    assert body.runs['{"n": 1}'] == 2


def test_transactional_needs_a_sql_store() -> None:
    with pytest.raises(ConfigurationError):
        make(transactional=True)


# --------------------------------------------------------------------------- invalid input
@pytest.mark.parametrize(
    ("message", "code"),
    [
        (Message(b"{not json", {"idempotency-key": "k"}), ErrorCode.INVALID_PAYLOAD),
        (Message(b"", {"idempotency-key": "k"}), ErrorCode.INVALID_PAYLOAD),
        (Message(b"\xff\xfe", {"idempotency-key": "k"}), ErrorCode.INVALID_PAYLOAD),
        (Message(b"[" * 100_000 + b"]" * 100_000, {"idempotency-key": "k"}),
         ErrorCode.INVALID_PAYLOAD),
        (Message(b"NaN", {"idempotency-key": "k"}), ErrorCode.INVALID_PAYLOAD),
        (Message(b'"' + b"x" * (2 << 20) + b'"', {"idempotency-key": "k"}),
         ErrorCode.INVALID_PAYLOAD),
        (Message(b"1", {}), ErrorCode.MISSING_KEY),
        (Message(b"1", {"idempotency-key": ""}), ErrorCode.MISSING_KEY),
        (Message(b"1", {"idempotency-key": "a\x00b"}), ErrorCode.INVALID_KEY),
        (Message(b"1", {"idempotency-key": "x" * 100_000}), ErrorCode.INVALID_KEY),
        (Message(b"1", {"idempotency-key": header_text(b"k\xff\xfe")}), ErrorCode.INVALID_KEY),
        (Message(b"1", {"idempotency-key": b"k\xff"}), ErrorCode.INVALID_KEY),
        (Message(b"1", {"idempotency-key": 17.5}), ErrorCode.INVALID_KEY),
        (Message(b"1", {"idempotency-key": "k", "idempotency-tenant": "t\x00"}),
         ErrorCode.INVALID_TENANT),
        (Message(b"1", {"idempotency-key": "k", "idempotency-tenant": "t" * 300}),
         ErrorCode.INVALID_TENANT),
        (Message(b"1", {"idempotency-key": "k",
                        "idempotency-tenant": header_text(b"\xc3\x28")}),
         ErrorCode.INVALID_TENANT),
    ],
    ids=["bad-json", "empty", "not-utf8-body", "deep-nesting", "nan", "huge-payload",
         "no-key", "empty-key", "nul-key", "huge-key", "non-utf8-key", "raw-bytes-key",
         "float-key", "nul-tenant", "long-tenant", "non-utf8-tenant"],
)
def test_invalid_input_is_rejected_never_raised(message: Message, code: ErrorCode) -> None:
    body = Recorder()
    out = make().process(message, body)
    assert (out.kind, out.error_code) == ("rejected", code)
    assert out.dead_letter and not body.runs


def test_payload_function_failure_is_rejected() -> None:
    consumer = make(payload=lambda m: m.value["nope"])
    out = consumer.process(msg(), lambda p: p)
    assert (out.kind, out.error_code) == ("rejected", ErrorCode.INVALID_PAYLOAD)


def test_hostile_header_names_and_values_do_not_crash() -> None:
    headers: dict[Any, Any] = {
        "idempotency-key": "ok", 7: "int-name", "x\x00y": "\x00", "big": "v" * 1_000_000,
        "list": [1, 2], "none": None,
    }
    out = make().process(Message(b"{}", headers), lambda p: "fine")
    assert out.kind == "executed"


# --------------------------------------------------------------------------- batches
def _script() -> list[Message]:
    """A mixed sequence: duplicates inside the batch, invalid input, a permanent and a
    transient failure, key reuse, and a scope that exists from before."""
    return [
        msg({"i": 1}, "a"),
        msg({"i": 2}, "b"),
        msg({"i": 1}, "a"),                # duplicate of the first, inside the batch
        Message(b"{bad", {"idempotency-key": "c"}),
        msg({"i": 3}, "poison"),
        msg({"i": 4}, "flaky"),
        msg({"i": 4}, "flaky"),            # after its first failed: runs again
        msg({"i": 99}, "b"),               # key reused with another payload
        msg({"i": 5}, "old"),              # SUCCESS from before the batch
        msg({"i": 6}, "d", **{"idempotency-tenant": "other"}),
        Message(b"{}", {"idempotency-key": "e", "idempotency-tenant": "\x00"}),
    ]


def _scripted_body() -> Recorder:
    body = Recorder()
    body.fail_with['{"i": 3}'] = [ValidationError("no")]
    body.fail_with['{"i": 4}'] = [Flaky("once")]
    return body


def _summary(outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
    return [(o.kind, o.result, o.error_code, o.error, o.tenant, o.key) for o in outcomes]


@pytest.mark.parametrize("batch_completion", [False, True])
def test_batch_outcomes_equal_sequential_outcomes(batch_completion: bool) -> None:
    single, batch = make(), make(batch_completion=batch_completion)
    for consumer in (single, batch):
        consumer.process(msg({"i": 5}, "old"), lambda p: "from-before")
    single_body, batch_body = _scripted_body(), _scripted_body()
    sequential = [single.process(m, single_body) for m in _script()]
    batched = batch.process_batch(_script(), batch_body)
    assert _summary(batched) == _summary(sequential)
    assert batch_body.runs == single_body.runs
    assert [o.kind for o in batched] == [
        "executed", "executed", "replayed", "rejected", "poisoned", "failed", "executed",
        "rejected", "replayed", "executed", "rejected",
    ]
    assert batched[8].result == "from-before"
    # and a redelivery of the whole batch replays / refuses without running anything again
    again_body = _scripted_body()
    again = batch.process_batch(_script(), again_body)
    assert [o.kind for o in again] == [
        "replayed", "replayed", "replayed", "rejected", "poisoned", "replayed", "replayed",
        "rejected", "replayed", "replayed", "rejected",
    ]
    assert not again_body.runs


@pytest.mark.parametrize(
    ("batch_completion", "writes"),
    [(False, ["mark_success"] * 20), (True, ["mark_success_many"])],  # 20 successes
)
def test_batch_claims_in_one_store_round_trip(batch_completion: bool, writes: list[str]) -> None:
    store = FaultyStore(MemoryStore())
    consumer = make(store, batch_completion=batch_completion)
    messages = [msg({"i": i}, f"k{i}") for i in range(20)] + [msg({"i": 0}, "k0")]
    outcomes = consumer.process_batch(messages, lambda p: p["i"])
    assert [o.kind for o in outcomes] == ["executed"] * 20 + ["replayed"]
    claims = [c for c in store.calls if c in ("create", "create_many", "get")]
    assert claims == ["create_many", "create"]  # the in-batch duplicate replays afterwards
    assert [c for c in store.calls if c.startswith("mark_")] == writes


@pytest.mark.parametrize("batch_completion", [False, True])
def test_batch_claims_every_scope_before_running_bodies(batch_completion: bool) -> None:
    consumer = make(batch_completion=batch_completion)
    seen: list[list[str]] = []

    def body(payload: Any) -> int:
        states = []
        for k in ("k0", "k1", "k2"):
            r = consumer.handler.get_record(operation="orders.created", tenant="acme", key=k)
            states.append(r.status.value if r else "-")
        seen.append(states)
        return 1

    outcomes = consumer.process_batch([msg({"i": i}, f"k{i}") for i in range(3)], body)
    assert seen[0] == ["PROCESSING"] * 3
    # each success is written as its body ends, or all of them after the batch's bodies
    assert seen[2] == ["PROCESSING"] * 3 if batch_completion else ["SUCCESS", "SUCCESS", "PROCESSING"]
    assert [o.kind for o in outcomes] == ["executed"] * 3
    after = [consumer.handler.get_record(operation="orders.created", tenant="acme", key=f"k{i}")
             for i in range(3)]
    assert [r.status.value if r else "-" for r in after] == ["SUCCESS"] * 3


def test_batch_completion_records_successes_before_a_later_message_of_the_same_scope() -> None:
    store = FaultyStore(MemoryStore())
    consumer = make(store, batch_completion=True)
    body = Recorder()
    messages = [msg({"i": 0}, "k0"), msg({"i": 1}, "k1"), msg({"i": 0}, "k0"), msg({"i": 2}, "k2")]
    outcomes = consumer.process_batch(messages, body)
    assert [o.kind for o in outcomes] == ["executed", "executed", "replayed", "executed"]
    assert [o.result for o in outcomes] == [{"ok": {"i": i}} for i in (0, 1, 0, 2)]
    assert [c for c in store.calls if c.startswith("mark_")] == ["mark_success_many"] * 2
    assert sum(body.runs.values()) == 3


def test_batch_completion_failing_leaves_its_scopes_to_the_lease() -> None:
    """The bodies ran but their successes could not be written: every one of them is
    ``store_unavailable`` (not acked), failures already recorded stay recorded."""
    store = FaultyStore(MemoryStore())
    consumer = make(store, batch_completion=True)
    body = _scripted_body()
    store.fail("mark_success_many")
    outcomes = consumer.process_batch(
        [msg({"i": 1}, "a"), msg({"i": 3}, "poison"), msg({"i": 2}, "b")], body
    )
    assert [(o.kind, o.key) for o in outcomes] == [
        ("store_unavailable", "a"), ("poisoned", "poison"), ("store_unavailable", "b"),
    ]
    assert all(o.error_code is ErrorCode.OUTCOME_NOT_RECORDED for o in (outcomes[0], outcomes[2]))
    rec = consumer.handler.get_record(operation="orders.created", tenant="acme", key="a")
    assert rec is not None and rec.status is Status.PROCESSING


def test_batch_with_store_down_runs_nothing() -> None:
    store = FaultyStore(MemoryStore())
    consumer = make(store)
    store.fail("create_many", "create")
    body = Recorder()
    outs = consumer.process_batch([msg({"i": i}, f"k{i}") for i in range(3)] + [
        msg({"i": 0}, "k0"), Message(b"{", {"idempotency-key": "x"})], body)
    assert [o.kind for o in outs] == ["store_unavailable"] * 4 + ["rejected"]
    assert not body.runs


def test_crash_mid_batch_counts_one_attempt_per_claimed_message() -> None:
    """Writes after the claim fail (as if the worker died after its bodies ran): every
    claimed scope stays PROCESSING; after lease expiry each is taken over, counted once."""
    clock = FakeClock()
    store = FaultyStore(MemoryStore())
    consumer = make(store, clock)
    store.fail("mark_success", "mark_success_many", "record_failure", "mark_failed", "release")
    messages = [msg({"i": i}, f"k{i}") for i in range(4)]
    first = consumer.process_batch(messages, lambda p: p["i"])
    assert [o.kind for o in first] == ["store_unavailable"] * 4
    store.heal()
    assert {o.kind for o in consumer.process_batch(messages, lambda p: p["i"])} == {"in_progress"}
    clock.advance(31)
    retaken = consumer.process_batch(messages, lambda p: p["i"])
    assert [(o.kind, o.retry_count, o.result) for o in retaken] == [
        ("executed", 1, i) for i in range(4)
    ]
    for i in range(4):
        rec = consumer.handler.get_record(operation="orders.created", tenant="acme", key=f"k{i}")
        assert rec is not None and rec.retry_count == 1


def test_empty_batch() -> None:
    assert make().process_batch([], lambda p: p) == []
    assert make(batch_completion=True).process_batch([], lambda p: p) == []


def test_batch_completion_refuses_transactional(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'idem.db'}")
    with pytest.raises(ConfigurationError) as info:
        make(store, batch_completion=True, transactional=True)
    assert "batch_completion" in info.value.message


# --------------------------------------------------------------------------- small pieces
def test_outcome_flags_partition_the_kinds() -> None:
    kinds = ["executed", "replayed", "in_progress", "failed", "poisoned", "rejected",
             "store_unavailable"]
    for kind in kinds:
        o = Outcome(kind)  # type: ignore[arg-type]
        assert o.settled != o.retry
        assert o.dead_letter == (kind in ("poisoned", "rejected"))


def test_dead_letter_headers() -> None:
    m = Message(b"x", None, topic="orders", partition=2, offset=40)
    out = Outcome("poisoned", error_code=ErrorCode.REQUEST_FAILED, error="ValidationError")
    assert dead_letter_headers(m, out) == {
        "idempotency-error-code": "REQUEST_FAILED", "idempotency-error": "ValidationError",
        "idempotency-original-topic": "orders", "idempotency-original-partition": "2",
        "idempotency-original-offset": "40",
    }
    queue = Message(b"x", None, topic="q", offset=5)
    rejected = Outcome("rejected", error_code=ErrorCode.MISSING_TENANT)
    assert dead_letter_headers(queue, rejected) == {
        "idempotency-error-code": "MISSING_TENANT", "idempotency-original-topic": "q",
        "idempotency-original-offset": "5",
    }


def test_header_text() -> None:
    assert header_text(b"abc") == "abc"
    assert header_text(3) == "3" and header_text(True) == "true"
    assert header_text(None) is None
    assert header_text(b"\xff").encode("utf-8", "surrogateescape") == b"\xff"
