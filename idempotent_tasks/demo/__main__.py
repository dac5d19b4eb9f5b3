"""``python -m idempotent_tasks.demo``: run the demo (see :mod:`idempotent_tasks.demo.run`)."""

from __future__ import annotations

from .run import main

raise SystemExit(main())
