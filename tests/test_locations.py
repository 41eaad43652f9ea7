"""Where hpctrain finds its files: shipped data by name."""

import pytest

from hpctrain import locations


def test_shipped_data_is_package_data():
    assert locations.shipped_names("nets", ".net")[:1] == ["alexnet"]
    assert {"cori-knl", "default"} <= set(locations.shipped_names("machines", ".toml"))
    assert "smallcnn-p4-mixed" in locations.shipped_names("plans", ".plan")
    assert (locations.shipped("nets") / "alexnet.net").read_text().startswith("#")
    with pytest.raises(ValueError, match="'datasets'"):
        locations.shipped("datasets")
