"""The replay's default class targets against the core's: the replay names its own
(``runner.DEFAULT_CLASSES_FILE``, which says why they differ) and reads the core's through the
binding; the two sets may differ only in the targets listed here."""

from __future__ import annotations

import json

from meridian._core import Config
from meridian.replay.corpus import TARGET_SETS
from meridian.replay.runner import default_meridian_config

#: (class, target): (the core's default, the replay's), every difference between the two sets.
REPLAY_LOOSER = {
    ("interactive", "ttft_ms"): (1000, 2000),
    ("interactive", "ttfat_ms"): (15000, 45000),
    ("standard", "ttft_ms"): (3000, 5000),
    ("standard", "ttfat_ms"): (60000, 120000),
}


def test_the_replay_defaults_differ_from_the_cores_only_where_named() -> None:
    core = Config.from_json("{}")
    replay = Config.from_json(json.dumps(default_meridian_config()))
    assert sorted(replay.class_names) == sorted(core.class_names)
    differences = {}
    for name in core.class_names:
        ours, theirs = core.class_targets(name), replay.class_targets(name)
        for target, value in ours.items():
            if theirs[target] != value:
                differences[(name, target)] = (value, theirs[target])
    assert differences == REPLAY_LOOSER


def test_the_corpus_default_set_is_the_replay_default() -> None:
    assert TARGET_SETS["default"] == default_meridian_config()["classes"]
