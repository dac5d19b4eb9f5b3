"""The verdict on a chaos run: the checks (docs/guarantees.md, see ``_harness.py``) and the
summary table."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idempotent_tasks import Record, Status

from ._body import OPERATIONS

if TYPE_CHECKING:
    from ._harness import ChaosEnv, Delivery

LEDGER_PROFILES = tuple(OPERATIONS)  # ("transactional", "plain")
RESULTS_PATH = Path(tempfile.gettempdir()) / "idempotent-tasks-chaos" / "results.jsonl"
SUMMARIES: list[dict[str, Any]] = []  # printed by the conftest at the end of the session


@dataclass
class RunFacts:
    """Everything the checks look at, gathered after the run."""

    rows: dict[str, dict[str, list[str]]]
    records: dict[str, dict[str, Record | None]]
    sent: list[tuple[Delivery, str]]
    results: dict[str, list[Any]]
    crashed: set[str]
    recovered: int
    status_counts: dict[tuple[str, str], int]


# -- the checks --------------------------------------------------------------------------------
@dataclass
class ProfileCheck:
    """The verdict on one ledger profile."""

    profile: str
    doubles: int = 0
    explained: int = 0
    lost: int = 0
    stale_results: int = 0
    problems: list[str] = field(default_factory=list)


def check_profile(profile: str, facts: RunFacts) -> ProfileCheck:
    out = ProfileCheck(profile)
    rows = facts.rows.get(profile, {})
    for key, record in facts.records[profile].items():
        tokens = rows.get(key, [])
        _check_key(out, key, tokens, record, profile == "transactional")
    by_key = _results_by_key(profile, facts)
    for key, results in by_key.items():
        _check_results(out, key, results, rows.get(key, []), facts.records[profile].get(key),
                       profile == "transactional")
    return out


def _check_key(out: ProfileCheck, key: str, tokens: list[str], record: Record | None,
               transactional: bool) -> None:
    if not tokens:
        out.lost += 1
        out.problems.append(f"{key}: lost (no ledger row)")
    extra = max(0, len(tokens) - 1)
    out.doubles += extra
    if record is None or record.status is not Status.SUCCESS:
        out.problems.append(f"{key}: record {record and record.status} after recovery")
        return
    if extra and extra <= record.retry_count:
        out.explained += extra
    elif extra:
        out.problems.append(f"{key}: {len(tokens)} rows, retry_count {record.retry_count}")
    if transactional and extra:
        out.problems.append(f"{key}: {len(tokens)} rows under transactional=True")
    token = (record.response or {}).get("token")
    if token not in tokens:
        out.problems.append(f"{key}: stored response {record.response} is no ledger row's")


def _results_by_key(profile: str, facts: RunFacts) -> dict[str, list[Any]]:
    by_key: dict[str, list[Any]] = {}
    for delivery, delivery_id in facts.sent:
        if delivery.profile != profile:
            continue
        by_key.setdefault(delivery.key, []).extend(facts.results.get(delivery_id) or [None])
    return by_key


def _check_results(out: ProfileCheck, key: str, results: list[Any], tokens: list[str],
                   record: Record | None, transactional: bool) -> None:
    expected = record.response if record is not None else None
    for result in results:
        if result == expected:
            continue
        token = result.get("token") if isinstance(result, dict) else None
        if not transactional and len(tokens) > 1 and token in tokens:
            out.stale_results += 1  # the stale owner of a doubled key got its own result back
            continue
        out.problems.append(f"{key}: a delivery got {result!r}, the record holds {expected!r}")


def check(facts: RunFacts, env: ChaosEnv, counts: dict[str, int], samples: int,
          violations: list[str], *, plain_steps: bool = False) -> None:
    """The guarantees; with ``plain_steps`` (the plain body a recorded step keyed downstream
    by ``ctx.derived_key``) the plain profile has no double either."""
    checks = {p: check_profile(p, facts) for p in LEDGER_PROFILES}
    problems = [f"[{p}] {msg}" for p, c in checks.items() for msg in c.problems]
    processing = {op: n for (op, status), n in facts.status_counts.items()
                  if status == "PROCESSING"}
    assert not processing, f"records left PROCESSING after recovery: {processing}"
    assert not problems, f"{len(problems)} violations:\n" + "\n".join(problems[:40])
    assert checks["transactional"].doubles == 0
    if plain_steps:
        assert checks["plain"].doubles == 0, checks["plain"]
    assert checks["transactional"].lost == 0 and checks["plain"].lost == 0
    assert samples >= 5, f"only {samples} counter samples"
    assert not violations, f"retry counters decreased: {violations[:10]}"
    _check_fault_coverage(env, facts, counts, plain_steps)


def _check_fault_coverage(env: ChaosEnv, facts: RunFacts, counts: dict[str, int],
                          plain_steps: bool) -> None:
    """The run really was what it claims: every planned fault fired, and every crash key
    crashed inside its body — after its effect — and was re-run by a counted takeover."""
    profile = env.profile
    planned = {"kill": profile.kills, "stop": profile.stops, "broker": profile.broker_faults,
               "pg_restart": profile.pg_restarts, "redis_stop": profile.redis_stops}
    assert counts == {k: n for k, n in planned.items() if n}, counts
    for p, keys in env.crash_keys.items():
        for key in keys:
            assert key in facts.crashed, f"crash key {key} never crashed"
            record = facts.records[p][key]
            assert record is not None and record.retry_count >= 1, (key, record)
            # a crash after a plain effect leaves its row behind: the takeover writes a second
            # one, unless the insert is keyed downstream (then it finds the first)
            expected_rows = 1 if p == "transactional" or plain_steps else 2
            assert len(facts.rows[p][key]) >= expected_rows, (key, facts.rows[p][key])


# -- the summary -------------------------------------------------------------------------------
def summarize(name: str, env: ChaosEnv, facts: RunFacts, counts: dict[str, int],
              restarts: int, duration: float) -> dict[str, Any]:
    per_profile = {}
    for p in LEDGER_PROFILES:
        c = check_profile(p, facts)
        sent = [d for d, _ in facts.sent if d.profile == p]
        per_profile[p] = {
            "operations": len(env.keys[p]), "deliveries": len(sent),
            "duplicate_deliveries": len(sent) - len(env.keys[p]),
            "doubles": c.doubles, "explained_doubles": c.explained, "lost": c.lost,
            "stale_owner_results": c.stale_results, "violations": len(c.problems),
            "scopes_retried": sum(1 for r in facts.records[p].values()
                                  if r is not None and r.retry_count > 0),
        }
    return {
        "integration": name, "profile": env.profile.name, "run_id": env.run_id,
        "kills": counts.get("kill", 0), "stops": counts.get("stop", 0),
        "broker_faults": counts.get("broker", 0), "pg_restarts": counts.get("pg_restart", 0),
        "redis_stops": counts.get("redis_stop", 0), "body_crashes": len(facts.crashed),
        "worker_restarts": restarts, "recovered_at_end": facts.recovered,
        "duration_s": round(duration, 1), "ledger": per_profile,
    }


COLUMNS = ("operations", "deliveries", "duplicate_deliveries", "scopes_retried", "doubles",
           "explained_doubles", "lost")
RUN_COLUMNS = ("kills", "stops", "broker_faults", "pg_restarts", "redis_stops", "body_crashes",
               "worker_restarts", "duration_s")


def format_summary(summary: dict[str, Any]) -> str:
    head = ["integration", "ledger profile", *COLUMNS, *RUN_COLUMNS]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for p, figures in summary["ledger"].items():
        cells = [f"{summary['integration']} ({summary['profile']})", p,
                 *(str(figures[c]) for c in COLUMNS), *(str(summary[c]) for c in RUN_COLUMNS)]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def report(summary: dict[str, Any]) -> None:
    """Print the table and append the summary as one JSON line to a temporary file."""
    SUMMARIES.append(summary)
    print("\n" + format_summary(summary))
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS_PATH.open("a", encoding="utf-8") as f:
        f.write(json.dumps(summary) + "\n")
