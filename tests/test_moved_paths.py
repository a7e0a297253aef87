"""Import paths of 0.1 that moved keep working for one release, each with a DeprecationWarning that
names the new path, and give the very module at the new path."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from swift_fast._compat import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_path_is_the_new_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_an_old_path_warns_and_names_the_new_one():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import swift_fast.report\nexcept DeprecationWarning as e:\n    print('warned:', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "warned: swift_fast.report moved to swift_fast.reports.best_of_n" in r.stdout


def test_the_warning_points_at_the_importing_line(tmp_path):
    user = tmp_path / "user_script.py"
    user.write_text("import swift_fast.rollouts\n")
    r = subprocess.run([sys.executable, "-W", "default::DeprecationWarning", str(user)], capture_output=True,
                       text=True, check=True)
    assert "user_script.py:1: DeprecationWarning: swift_fast.rollouts moved to swift_fast.data.rollouts" in r.stderr


def test_the_module_keeps_its_own_name_and_spec():
    old = importlib.import_module("swift_fast.confidence")
    assert old.__name__ == old.__spec__.name == "swift_fast.rewards.confidence"


def test_collect_from_hf_still_works_with_a_warning():
    # a fresh process: importing the old module path swift_fast.hf.collect binds that name to the module
    code = (
        "import warnings\n"
        "import swift_fast.hf as hf\n"
        "from swift_fast.jobs.collect import CollectConfig, collect\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    assert hf.CollectConfig is CollectConfig and hf.collect is collect\n"
        "for w in seen:\n"
        "    print(str(w.message).split(';')[0])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == [
        "swift_fast.hf.CollectConfig moved to swift_fast.jobs.collect.CollectConfig",
        "swift_fast.hf.collect moved to swift_fast.jobs.collect.collect",
    ]


def test_every_new_path_exists():
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None, new


def test_the_old_files_are_gone():
    import os

    import swift_fast

    root = os.path.dirname(swift_fast.__file__)
    for old in MOVED:
        rel = old.split(".")[1:]
        assert not os.path.exists(os.path.join(root, *rel) + ".py"), old
