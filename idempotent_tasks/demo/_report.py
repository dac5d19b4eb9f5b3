"""What each demo scenario reports back to the demo's printer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ScenarioLine:
    """One row of the demo report.

    ``scenario``: e.g. "duplicate deliveries"; ``deliveries``: messages sent;
    ``executions``: how many times the body really ran; ``outcome``: what the library did
    ("replayed", "poisoned after 3 tries", "recovered by beat", …); ``ok``: whether what
    happened is what the guarantee promises (the demo exits non-zero otherwise).
    """

    integration: str
    scenario: str
    deliveries: int
    executions: int
    outcome: str
    ok: bool
    details: dict[str, object] = field(default_factory=dict)
