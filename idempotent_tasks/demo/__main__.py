"""``python -m idempotent_tasks.demo [--store URL] [--keep]``: the same as
``idempotent-tasks demo``, with the CLI's error handling and exit codes (see
:mod:`idempotent_tasks.demo.run`).  Only this entry point imports the CLI; the demo package
itself never does."""

from __future__ import annotations

import sys

from ..cli import main

raise SystemExit(main(["demo", *sys.argv[1:]]))
