"""The package as users meet it: ``python -m build`` makes a wheel and an sdist; the wheel,
installed into a fresh virtualenv with no extra and with each extra, imports every public
module, and what an extra would bring is refused with its install hint.  The demo runs with
no extra, and ``[all]`` carries what a Celery worker on the Redis broker needs.

Time: one build (~3 s), one wheelhouse resolved from the package index (~5 s), then ten
offline installs, two at a time (~30-60 s on a 2-core machine).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tomllib
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .._services import REDIS_URL, require
from ._venvs import ROOT, new_venv, pip, probe, run

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("probe.py")

#: Which installs make each optional piece work (every other install must refuse it with
#: ``pip install 'idempotent-tasks[<extra>]'``).  Celery brings kombu (RabbitMQ consumer);
#: the dramatiq extra brings redis-py and prometheus-client.
PROVIDED_BY: dict[str, tuple[str, set[str]]] = {
    "idempotent_tasks.celery": ("celery", {"celery", "all"}),
    "idempotent_tasks.dramatiq": ("dramatiq", {"dramatiq", "all"}),
    "idempotent_tasks.consumers.kafka": ("kafka", {"kafka", "all"}),
    "idempotent_tasks.consumers.rabbitmq": ("rabbitmq", {"rabbitmq", "celery", "all"}),
    "use:postgres": ("postgres", {"postgres", "all"}),
    "use:redis": ("redis", {"redis", "dramatiq", "all"}),
    "use:prometheus": ("prometheus", {"prometheus", "celery", "dramatiq", "all"}),
    "idempotent_tasks.dashboard": ("dashboard", {"dashboard"}),
}
#: Every extra a user installs (pyproject.toml's, less the project's own dev and bench).
EXTRAS = tuple(sorted(
    set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    - {"dev", "bench"}
))


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("idempotent_tasks-*.whl")
    return found


@pytest.fixture(scope="session")
def wheelhouse(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every distribution any extra needs, resolved once from the index; installs read it
    with ``--no-index``."""
    house = tmp_path_factory.mktemp("wheelhouse")
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                "-w", str(house), f"idempotent-tasks[{','.join(EXTRAS)}] @ {wheel.as_uri()}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return house


def _install(where: Path, wheelhouse: Path, extra: str | None) -> Path:
    python = new_venv(where)
    spec = "idempotent-tasks" + (f"[{extra}]" if extra else "")
    proc = pip(python, "install", "--no-compile", "--no-index", "--find-links", str(wheelhouse),
               spec)
    assert proc.returncode == 0, f"{spec}: {proc.stderr[-3000:]}"
    return python


@pytest.fixture(scope="session")
def venvs(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"none" | extra: interpreter}``, one fresh virtualenv each."""
    root = tmp_path_factory.mktemp("venvs")
    names = ("none", *EXTRAS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        pythons = pool.map(
            lambda n: _install(root / n, wheelhouse, None if n == "none" else n), names)
        return dict(zip(names, pythons, strict=True))


def test_the_wheel_and_the_sdist(dist: Path, wheel: Path) -> None:
    (sdist,) = dist.glob("idempotent_tasks-*.tar.gz")
    assert sdist.stat().st_size > 0
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(entry_points).decode()
    assert "idempotent_tasks/py.typed" in names
    assert "idempotent_tasks/pytest_plugin.py" in names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)
    assert re.search(r"\[pytest11\]\s+idempotent_tasks = idempotent_tasks\.pytest_plugin", text)
    assert "idempotent-tasks = idempotent_tasks.cli:main" in text


@pytest.mark.parametrize("install", ["none", *EXTRAS])
def test_every_public_module_imports_or_names_its_extra(
    venvs: dict[str, Path], install: str
) -> None:
    result = probe(venvs[install], PROBE)
    for check, outcome in result.items():
        extra, providers = PROVIDED_BY.get(check, (None, set()))
        if extra is None or install in providers:
            assert outcome == "ok", f"{install}: {check}: {outcome}"
        else:
            assert f"pip install 'idempotent-tasks[{extra}]'" in outcome, (install, check,
                                                                          outcome)


def test_the_demo_with_no_extra_skips_frameworks_with_their_hint(
    venvs: dict[str, Path], tmp_path: Path
) -> None:
    exe = venvs["none"].with_name("idempotent-tasks")
    proc = run([str(exe), "demo"], cwd=tmp_path, timeout=120,
               env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INTERNAL_ERROR" not in out + proc.stderr and "Traceback" not in proc.stderr
    assert "skipped celery: celery is not installed: pip install 'idempotent-tasks[celery]'" in out
    assert ("skipped dramatiq: dramatiq is not installed: pip install "
            "'idempotent-tasks[dramatiq]'") in out
    assert ("totals not shown: prometheus-client is not installed: pip install "
            "'idempotent-tasks[prometheus]'") in out
    assert "demo OK: all 12 scenarios behaved as guaranteed" in out


CELERY_ON_REDIS = '''
import sys
from celery import Celery
from celery.contrib.testing.worker import start_worker

url, queue = sys.argv[1], sys.argv[2]
app = Celery("redis_broker_check", broker=url, backend=url, set_as_current=False)
app.conf.task_default_queue = queue

@app.task(shared=False)
def add(a, b):
    return a + b

try:
    with start_worker(app, pool="solo", perform_ping_check=False):
        print(add.delay(2, 3).get(timeout=30))
finally:
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
'''


def test_all_brings_what_a_celery_worker_on_redis_needs(
    venvs: dict[str, Path], tmp_path: Path
) -> None:
    """``celery[redis]`` (kombu's Redis transport needs ``packaging``, the result backend
    imports it too): a real worker on the Redis broker and result backend, in the [all]
    virtualenv."""
    require("redis")
    script = tmp_path / "celery_on_redis.py"
    script.write_text(CELERY_ON_REDIS)
    queue = f"packaging-{uuid.uuid4().hex[:12]}"
    proc = run([str(venvs["all"]), str(script), REDIS_URL, queue], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "5"


# ------------------------------------------------------------------------ example READMEs
EXAMPLE_IMPORTS = {
    "celery_app": "import tasks",
    "dramatiq_app": "import actors",
    "fastapi_payments": "import app",
}


def _install_line(readme: Path) -> list[str]:
    lines = [ln for ln in readme.read_text().splitlines() if ln.startswith("pip install")]
    assert len(lines) == 1, (readme, lines)
    words = lines[0].split("#", 1)[0].split()
    return [w.strip("'") for w in words[2:]]


@pytest.mark.parametrize("example", sorted(EXAMPLE_IMPORTS))
def test_an_example_readmes_install_line_works_as_written(example: str, tmp_path: Path) -> None:
    """The README's ``pip install …`` (run from the repository root, as it says) into a
    fresh virtualenv; then the example's module imports there."""
    directory = ROOT / "examples" / example
    args = _install_line(directory / "README.md")
    assert args and args[0] == "-e" and args[1].startswith(".["), args  # from the checkout
    python = new_venv(tmp_path / "venv")
    proc = pip(python, "install", "--no-compile", *args, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "does not provide the extra" not in proc.stderr, proc.stderr
    work = tmp_path / "work"
    shutil.copytree(directory, work)
    env = {**os.environ, "STORE_URL": f"sqlite:///{work / 'idem.db'}",
           "IDEMPOTENCY_STORE": f"sqlite:///{work / 'idem.db'}"}
    imported = run([str(python), "-c", EXAMPLE_IMPORTS[example]], cwd=work, env=env)
    assert imported.returncode == 0, imported.stderr[-3000:]
