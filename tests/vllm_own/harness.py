"""Pytest plugin: what vLLM's own tests need to run on this machine, and the report of each run.

vLLM's scheduler tests build ``ModelConfig(model="facebook/opt-125m")`` and a few other hub
models; there is no Hugging Face hub here, so this plugin points vLLM's model redirect
(``VLLM_MODEL_REDIRECT_PATH``) at the configs in ``tests/vllm_own/models/<org>/<name>/``, written
for this check (a ``config.json``, and for the multimodal models the tokenizer and processor
files their processors read, with a handful of special tokens: no weights, no real vocabulary),
and keeps transformers and huggingface_hub offline. With ``--vllm-own-report PATH`` it writes one
JSON object per test (node id, outcome, one-line reason, seconds) for ``scripts/check_vllm.py`` to compare.
Invariant: it changes no test and no vLLM behaviour; whatever it cannot provide (a model not under
``models/``) fails the test as it would anywhere offline, and the report says so.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Model configs by hub id: ``models/<org>/<name>/config.json`` serves ``<org>/<name>``.
MODELS = Path(__file__).resolve().parent / "models"

#: Outcomes as the report names them.
PASSED, FAILED, ERROR, SKIPPED, XFAILED, XPASSED = "passed", "failed", "error", "skipped", "xfailed", "xpassed"


def model_redirects() -> dict[str, str]:
    """Hub id -> local folder, for every config under ``models/``."""
    return {
        f"{config.parent.parent.name}/{config.parent.name}": str(config.parent)
        for config in sorted(MODELS.glob("*/*/config.json"))
    }


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--vllm-own-report",
        metavar="PATH",
        default=None,
        help="write each test's outcome and one-line reason to PATH (JSON; tests/vllm_own/harness.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Before any test imports vLLM's config: vLLM reads these from the environment when it
    # resolves a model, and transformers when it loads one.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    handle, path = tempfile.mkstemp(prefix="vllm-own-models-", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump(model_redirects(), out)
    os.environ["VLLM_MODEL_REDIRECT_PATH"] = path
    _REDIRECT_FILES.append(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _REDIRECT_FILES:
        Path(_REDIRECT_FILES.pop()).unlink(missing_ok=True)


def pytest_report_header(config: pytest.Config) -> str:
    return f"vLLM's hub models redirected to {MODELS} ({', '.join(model_redirects())})"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # A module that does not import fails every test in it: it is reported under its own id.
    if report.failed:
        _record(report.nodeid, ERROR, _reason(report))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration
    outcome = _outcome(report)
    if outcome is None:
        if report.nodeid in _RESULTS:  # the teardown of a recorded test: its time only
            _RESULTS[report.nodeid]["seconds"] = round(_SECONDS[report.nodeid], 3)
        return
    # A failing teardown after a passing call still fails the test; the first failure's reason
    # is the one kept.
    earlier = _RESULTS.get(report.nodeid)
    if earlier is not None and earlier["outcome"] in (FAILED, ERROR):
        earlier["seconds"] = round(_SECONDS[report.nodeid], 3)
        return
    _record(report.nodeid, outcome, _reason(report))


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--vllm-own-report")
    if path is not None:
        Path(path).write_text(json.dumps(list(_RESULTS.values()), indent=1) + "\n")


# ---- details -----------------------------------------------------------------------------------

#: This run's outcomes by node id (pytest's report hooks are handed no config to keep them on).
_RESULTS: dict[str, dict[str, str | float]] = {}
#: Each test's time so far, setup, call and teardown together.
_SECONDS: dict[str, float] = {}
_REDIRECT_FILES: list[str] = []


def _record(nodeid: str, outcome: str, reason: str) -> None:
    seconds = round(_SECONDS.get(nodeid, 0.0), 3)
    _RESULTS[nodeid] = {"test": nodeid, "outcome": outcome, "reason": reason, "seconds": seconds}


def _outcome(report: pytest.TestReport) -> str | None:
    """The test's outcome as far as this phase tells it, or None where the phase tells nothing
    (a passing setup or teardown)."""
    if hasattr(report, "wasxfail"):
        return XFAILED if report.skipped else XPASSED
    if report.skipped:
        return SKIPPED
    if report.failed:
        return FAILED if report.when == "call" else ERROR
    return PASSED if report.when == "call" else None


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """One line saying why: the exception's message for a failure (with what Meridian itself
    ended, where it did), the reason for a skip."""
    longrepr: Any = report.longrepr
    if longrepr is None:
        return str(getattr(report, "wasxfail", ""))
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return _one_line(str(longrepr[2]).removeprefix("Skipped: "))
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else "".join(str(longrepr).strip().splitlines()[-1:])
    return _one_line(text) + _meridian_ended(report)


#: Meridian's log lines for a request it ended itself (scheduler.py: a shed, a rejection).
_ENDED = re.compile(r"meridian: (?:meridian:shed:\S+ (?P<shed>.*)|rejecting request (?P<rejected>.*))")


def _meridian_ended(report: pytest.TestReport | pytest.CollectReport) -> str:
    """`` [Meridian shed N: first message]`` where the failing test's captured log shows
    MeridianScheduler ending requests itself: the usual cause of a test that then waits for
    them in vain (a request the test hands over already past its class's TTFT target on the
    test's clock, tests/vllm_own/substitute.py)."""
    log = "\n".join(text for name, text in report.sections if "log" in name)
    shed = [m["shed"] for m in _ENDED.finditer(log) if m["shed"]]
    rejected = [m["rejected"] for m in _ENDED.finditer(log) if m["rejected"]]
    notes = []
    if shed:
        notes.append(f"Meridian shed {len(shed)}: {_one_line(shed[0], 120)}")
    if rejected:
        notes.append(f"Meridian rejected {len(rejected)}: {_one_line(rejected[0], 120)}")
    return f" [{'; '.join(notes)}]" if notes else ""


def _one_line(text: str, limit: int = 240) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"
