"""The house rules, as ``make lint`` checks them: import-linter's contracts (imports run one way
through the layers, no product module imports test code, no import cycles) and the import-time
rule (outside ``meridian.vllm`` nothing loads vLLM when imported). Each check is also shown to
fail on a copy of the package with one rule broken, so neither can pass vacuously."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path, python_path: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed (make setup)")
    env = {"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(python_path), "HOME": str(cwd)}
    only = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *only], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)


def test_the_import_contracts_are_kept() -> None:
    result = lint_imports(REPO, REPO / "python")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "also_broken"),
    [
        # An import up the layers also closes a cycle (every layer reaches those below it).
        ("offline/tiny.py", "import meridian.demo  # noqa: F401", "layers", {"acyclic"}),
        ("offline/tiny.py", "import tests  # noqa: F401", "no-test-code", set()),
        # A cycle inside one layer breaks no layer.
        ("vllm/config.py", "from meridian.vllm import scheduler  # noqa: F401", "acyclic", set()),
    ],
)
def test_each_contract_breaks_when_its_rule_does(
    tmp_path: Path, module: str, line: str, contract: str, also_broken: set[str]
) -> None:
    shutil.copytree(REPO / "python" / "meridian", tmp_path / "python" / "meridian",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "python" / "meridian" / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}\n")
    others = [c for c in ("layers", "no-test-code", "acyclic") if c != contract and c not in also_broken]
    assert lint_imports(tmp_path, tmp_path / "python", *others).returncode == 0, "only the one rule is broken"
    result = lint_imports(tmp_path, tmp_path / "python", contract)
    assert result.returncode != 0 and "1 broken" in result.stdout, result.stdout


def test_nothing_outside_meridian_vllm_loads_vllm_at_import() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "check_import_time.py")], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept" in result.stdout
