"""The router recipe in ``deploy/gaie/`` (an EndpointPickerConfig and Helm values for the Gateway API
Inference Extension's Endpoint Picker) names only series that exist: Meridian's from
``names.METRIC_NAMES``, vLLM's from the names vLLM's own stat logger registers (read from its
source, without importing vLLM); its queue scorer reads ``meridian:expected_output_tokens``; the
config embedded in the Helm values is the standalone file's; and both files name the same GAIE
release they were written against."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from meridian.vllm.names import METRIC_NAMES

yaml = pytest.importorskip("yaml")

RECIPE = Path(__file__).resolve().parents[2] / "deploy" / "gaie"
CONFIG = RECIPE / "endpoint-picker-config.yaml"
VALUES = RECIPE / "helm-values.yaml"
# Every series name in the files' text, comments included: a name in a comment is advice too.
SERIES = re.compile(r"\b((?:meridian|vllm):[A-Za-z0-9_:]+)")
SUFFIXES = ("_total", "_bucket", "_sum", "_count")  # what the exposition adds to a family's name
QUEUE_FLAG = "total-queued-requests-metric"


def named_series() -> set[str]:
    return {name for path in (CONFIG, VALUES) for name in SERIES.findall(path.read_text())}


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return loaded


def vllm_series() -> set[str]:
    """The series names vLLM's stat logger registers (``vllm/v1/metrics/loggers.py``)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    loggers = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    return set(re.findall(r"[\"'](vllm:[A-Za-z0-9_:]+)[\"']", loggers.read_text()))


def known(name: str, defined: set[str]) -> bool:
    return name in defined or any(name.endswith(s) and name.removesuffix(s) in defined for s in SUFFIXES)


def test_every_meridian_series_the_recipe_names_is_one_meridian_exports() -> None:
    meridian = {n for n in named_series() if n.startswith("meridian:")}
    assert METRIC_NAMES["expected_output_tokens"] in meridian
    unknown = {n for n in meridian if not known(n, set(METRIC_NAMES.values()))}
    assert not unknown, unknown


@pytest.mark.vllm
def test_every_vllm_series_the_recipe_names_is_one_vllm_defines() -> None:
    defined = vllm_series()
    assert "vllm:num_requests_waiting" in defined and "vllm:kv_cache_usage_perc" in defined, "parsed loggers.py"
    named = {n for n in named_series() if n.startswith("vllm:")}
    unknown = {n for n in named if not known(n, defined)}
    assert not unknown, unknown


def test_every_metric_flag_names_a_meridian_or_vllm_series() -> None:
    flags = values()["inferenceExtension"]["flags"]
    metric_flags = {k: v for k, v in flags.items() if k.endswith("-metric")}
    assert metric_flags
    for flag, spec in metric_flags.items():
        assert SERIES.fullmatch(spec.split("{", 1)[0]), (flag, spec)


def test_the_queue_scorer_reads_meridians_expected_output_tokens() -> None:
    assert values()["inferenceExtension"]["flags"][QUEUE_FLAG] == METRIC_NAMES["expected_output_tokens"]
    config = yaml.safe_load(CONFIG.read_text())
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights["queue-scorer"] and weights["queue-scorer"] > 0


def test_the_config_is_an_endpoint_picker_config_whose_references_resolve() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    assert set(config) == {"apiVersion", "kind", "plugins", "schedulingProfiles"}
    names = {p.get("name", p["type"]) for p in config["plugins"]}
    types = {p["type"] for p in config["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= types
    refs = [p["pluginRef"] for prof in config["schedulingProfiles"] for p in prof["plugins"]]
    assert set(refs) <= names and len(refs) == len(set(refs))


def test_the_helm_values_embed_the_config_file_and_point_the_epp_at_it() -> None:
    ext = values()["inferenceExtension"]
    embedded = ext["pluginsCustomConfig"][ext["pluginsConfigFile"]]
    assert yaml.safe_load(embedded) == yaml.safe_load(CONFIG.read_text())


def test_both_files_are_stamped_with_the_same_gaie_release() -> None:
    stamp = re.compile(r"Written against GAIE (v\d+\.\d+\.\d+)")
    releases = {path.name: stamp.findall(path.read_text()) for path in (CONFIG, VALUES)}
    assert all(len(found) == 1 for found in releases.values()), releases
    assert len({found[0] for found in releases.values()}) == 1, releases
    release = releases[VALUES.name][0]
    assert f"--version {release}" in VALUES.read_text()
