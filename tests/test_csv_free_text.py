"""A free-text CSV column is refused loudly, not one-hot encoded into a feature per
value (issue 34: 150 distinct comments became 150 features without a word)."""

from __future__ import annotations

import pytest

from hfl.data import load_csv
from hfl.peer.config import ConfigError, config_from_dict
from hfl.peer.factory import load_peer_data


def table(tmp_path, distinct: int, rows: int = 120):
    lines = ["size,comment,colour,label"]
    lines += [f"{i % 7},note number {i % distinct},{('red', 'blue')[i % 2]},{i % 2}" for i in range(rows)]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_text_column_with_many_distinct_values_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError) as err:
        load_csv(table(tmp_path, distinct=60), "label")
    msg = str(err.value)
    assert "column 'comment': 60 distinct text values in 120 rows" in msg
    assert "options.categorical" in msg and "'note number 0'" in msg


def test_named_explicitly_it_is_one_hot_encoded_and_a_real_category_still_is(tmp_path):
    ds = load_csv(table(tmp_path, distinct=60), "label", categorical=["comment", "colour"])
    assert ds.x.shape == (120, 1 + 60 + 2)
    ds = load_csv(table(tmp_path, distinct=50), "label")  # at the limit: still a category
    assert ds.x.shape == (120, 1 + 50 + 2)


def test_a_peer_config_names_the_data_section(tmp_path):
    cfg = config_from_dict({"security": {"mode": "none"},
                            "node": {"id": "a", "listen": "mem://a", "run_dir": str(tmp_path / "r")},
                            "data": {"dataset": "csv", "path": str(table(tmp_path, distinct=150, rows=300)),
                                     "target": "label"}})
    with pytest.raises(ConfigError) as err:
        load_peer_data(cfg.data)
    assert "150 distinct text values" in str(err.value) and str(err.value).startswith("data")
