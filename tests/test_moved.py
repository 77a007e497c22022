"""The load generator's modules moved into ``servescope.load``; code that imports them by
their old paths keeps working for one release, warned, and gets the very same module."""

import importlib
import sys

import pytest

OLD = ["loadgen", "bench", "cluster", "streams", "slo", "sweep", "timeline", "inputs", "request_log", "openai_api"]


@pytest.mark.parametrize("name", OLD)
def test_an_old_path_is_the_new_module_with_a_warning(name):
    new = importlib.import_module(f"servescope.load.{name}")
    sys.modules.pop(f"servescope.{name}", None)
    with pytest.warns(DeprecationWarning, match=rf"servescope\.{name} moved to servescope\.load\.{name}"):
        old = importlib.import_module(f"servescope.{name}")
    assert old is new


def test_the_old_names_of_the_library_still_run_a_bench():
    sys.modules.pop("servescope.bench", None)
    with pytest.warns(DeprecationWarning):
        from servescope.bench import BenchOptions, run_bench  # noqa: F401 - the names users import
    assert BenchOptions.__module__ == "servescope.load.bench"
