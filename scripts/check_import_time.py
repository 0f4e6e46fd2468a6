"""Checks the import rule import-linter cannot see: outside ``meridian.vllm``, no module of the
package imports vLLM when it is imported (the layers above reach vLLM lazily, inside the
functions that need it), and ``meridian.vllm`` itself and ``meridian.vllm.names`` load none
either, so every layer can read the names. import-linter's contracts (``make lint``) count
function-level imports too, so they cannot tell a lazy import from an eager one.

    python scripts/check_import_time.py      # exit 0: kept; 1: the modules that break it
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

#: Modules of meridian.vllm that must stay light (every layer imports them).
LIGHT_VLLM_MODULES = ("meridian.vllm", "meridian.vllm.names", "meridian.vllm._version")


def modules_to_check() -> list[str]:
    import meridian

    names = ["meridian"]
    for info in pkgutil.walk_packages(meridian.__path__, "meridian."):
        if info.name == "meridian.vllm" or info.name.startswith("meridian.vllm."):
            continue
        names.append(info.name)
    return sorted(names) + list(LIGHT_VLLM_MODULES)


def loads_vllm(modules: list[str]) -> bool:
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "sys.exit(1 if any(n == 'vllm' or n.startswith('vllm.') for n in sys.modules) else 0)\n"
    return subprocess.run([sys.executable, "-c", code], check=False).returncode != 0


def main() -> int:
    modules = modules_to_check()
    if not loads_vllm(modules):
        print(f"import time: kept ({len(modules)} modules outside meridian.vllm load no vLLM)")
        return 0
    culprits = [m for m in modules if loads_vllm([m])]
    print("import time: BROKEN; these modules import vLLM when imported (import it inside the function that needs it):")
    for name in culprits:
        print(f"  {name}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
