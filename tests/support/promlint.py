"""What Prometheus itself says of a /metrics text: promtool's linter (scripts/promlint, built
by scripts/setup-promlint) and client_python's parser. Missing linter: skipped with the reason
locally, a failure under CI=true."""

from __future__ import annotations

import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, require

PROMLINT = REPO / ".cache" / "promlint" / "promlint"


def lint(text: str) -> list[str]:
    """promtool check metrics' problems with `text` ("metric: problem" lines)."""
    if not PROMLINT.exists():
        require(f"{PROMLINT.relative_to(REPO)} is missing (scripts/setup-promlint builds it)")
    done = subprocess.run([PROMLINT], input=text, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode in (0, 3), done.stderr
    return done.stdout.splitlines()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample of `text` as parsed by client_python: (name, sorted labels) → value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        return str(answer.read().decode())
