"""The documentation's generated references against their one source each: every key the core's
configuration parser accepts is on ``docs/configuration.md`` and every series Meridian exports on
``docs/metrics.md``, and both pages are what ``scripts/gen_reference.py`` writes today. The
schema the configuration page is generated from is itself checked against the parser: every key
it lists is accepted with its documented default, and every object it describes rejects an
unknown key."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config, config_schema
from meridian.errors import ConfigError
from meridian.vllm.names import LABEL_VALUES, METRIC_NAMES, SERIES

REPO = Path(__file__).resolve().parents[2]
CONFIG_PAGE = REPO / "docs" / "configuration.md"
METRICS_PAGE = REPO / "docs" / "metrics.md"
SCHEMA: dict[str, Any] = json.loads(config_schema())
DEFAULTS: dict[str, Any] = json.loads(Config.from_json("{}").to_json())
#: A class block the parser accepts, to reach the keys under `classes.<name>`.
CLASS = {"ttft_ms": 1000, "ttfat_ms": 5000, "answer_tpot_ms": 50, "rank": 0}


@functools.cache
def generator() -> Any:
    """``scripts/gen_reference.py``, loaded from its file (``scripts`` is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while True:
        if "$ref" in node:
            node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node and len([o for o in node["anyOf"] if o.get("type") != "null"]) == 1:
            node = next(o for o in node["anyOf"] if o.get("type") != "null")
        else:
            return node


def schema_keys(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every key of the schema, as its path (a map's keys as `<name>`) and its schema."""
    target = resolve(node)
    for name, prop in target.get("properties", {}).items():
        yield (*path, name), prop
        yield from schema_keys(prop, (*path, name))
    values = target.get("additionalProperties")
    if isinstance(values, dict) and "properties" in resolve(values):
        yield from schema_keys(values, (*path, "<name>"))


KEYS = dict(schema_keys(SCHEMA))


def block_with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """The smallest `meridian` block that sets `path` to `value` (a class named `gold` stands in
    for `<name>`)."""
    block: dict[str, Any] = {}
    node = block
    for i, part in enumerate(path[:-1]):
        if part == "<name>":
            node["gold"] = dict(CLASS)
            node = node["gold"]
            continue
        node = node.setdefault(part, {})
    node[path[-1].replace("<name>", "gold")] = value
    if "<name>" in path:
        block["default_class"] = "gold"
    return block


def default_of(path: tuple[str, ...], prop: dict[str, Any]) -> tuple[bool, Any]:
    value: Any = DEFAULTS
    for part in path:
        if not isinstance(value, dict) or part not in value:
            break
        value = value[part]
    else:
        return True, value
    return ("default" in prop, prop.get("default"))


def test_the_schema_reaches_every_block_of_the_configuration() -> None:
    dotted = {".".join(path) for path in KEYS}
    for key in ("policy", "overload.shed_until", "classes.<name>.ttft_ms", "classes.<name>.thinking_control.eat.alpha",
                "thinking_control.boundaries.line_end", "predictor.prior_memory_requests", "kv_tier.restore"):
        assert key in dotted, key
    assert all(resolve(p).get("description") or p.get("description") for p in KEYS.values())


@pytest.mark.parametrize("path", list(KEYS), ids=".".join)
def test_every_documented_key_is_accepted_with_its_default(path: tuple[str, ...]) -> None:
    found, value = default_of(path, KEYS[path])
    if path[0] == "classes" and len(path) == 3 and path[2] in CLASS:
        found, value = True, CLASS[path[2]]
    if not found:
        pytest.skip("no default to set (the key is unset by default)")
    Config.from_json(json.dumps(block_with(path, value)))


@pytest.mark.parametrize("path", [(), ("classes", "<name>")] + [p for p, prop in KEYS.items() if "properties" in resolve(prop)],
                         ids=lambda p: ".".join(p) or "meridian")
def test_every_documented_object_rejects_an_unknown_key(path: tuple[str, ...]) -> None:
    block = block_with((*path, "not_a_key"), 1) if path else {"not_a_key": 1}
    with pytest.raises(ConfigError, match="not_a_key"):
        Config.from_json(json.dumps(block))


def documented(page: str, key: str) -> bool:
    """Whether the page has a section for `key`, directly or through a block that "takes the same
    keys as" another one (`classes.<name>.thinking_control` → `thinking_control`)."""
    anchor = generator()._anchor
    sections = dict(re.findall(r"\{#(key-[a-z0-9_-]+)\}\n(.*?)(?=\n#|\Z)", page, re.S))
    if anchor(key) in sections:
        return True
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        body = sections.get(anchor(".".join(parts[:cut])), "")
        same = re.search(r"Takes the same keys as \[`([^`]+)`\]\(#(key-[a-z0-9_-]+)\)", body)
        if same:
            return documented(page, ".".join([same.group(1), *parts[cut:]]))
    return False


def test_the_configuration_page_documents_every_key_the_core_accepts() -> None:
    page = CONFIG_PAGE.read_text(encoding="utf-8")
    missing = [".".join(p) for p in KEYS if not documented(page, ".".join(p))]
    assert not missing, f"keys the core accepts but docs/configuration.md lacks: {missing}"
    assert not documented(page, "overload.not_a_key")


def test_the_configuration_defaults_round_trip() -> None:
    again = Config.from_json(json.dumps(DEFAULTS))
    assert json.loads(again.to_json()) == DEFAULTS
    every = copy.deepcopy(DEFAULTS)
    every["request_log_path"] = "requests.jsonl"
    every["classes"]["standard"]["e2e_ms"] = 90_000
    assert json.loads(Config.from_json(json.dumps(every)).to_json()) == every


def test_the_metrics_page_lists_every_series() -> None:
    page = METRICS_PAGE.read_text(encoding="utf-8")
    for series in SERIES.values():
        assert f"| `{series.name}` | {series.kind} |" in page, series.name
        for label in series.labels:
            assert label == "class" or label in LABEL_VALUES, (series.name, label)
    assert METRIC_NAMES == {key: s.name for key, s in SERIES.items()}
    assert all(s.name.endswith("_total") == (s.kind == "counter") for s in SERIES.values())


def test_the_generated_pages_are_current() -> None:
    gen = generator()
    for page, text in gen.pages():
        assert page.read_text(encoding="utf-8") == text, (
            f"{page.relative_to(REPO)} is stale: run `python scripts/gen_reference.py`")
