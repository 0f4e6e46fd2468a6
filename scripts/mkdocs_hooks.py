"""MkDocs hooks (``hooks:`` in mkdocs.yml): the benchmark plots under ``bench/results/`` are
served at ``bench-results/<run>/<plot>.png`` straight from where the benchmarks wrote them, so the
docs show them without a copy in ``docs/`` that could drift from the results."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for plot in sorted(RESULTS.rglob("*.png")):
        uri = f"bench-results/{plot.relative_to(RESULTS).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(plot)))
    return files
