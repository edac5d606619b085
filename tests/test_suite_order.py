"""The suite's collection order (tests/conftest.py): whole modules, those with the most slow tests first, so that
under --dist loadgroup (scripts/test.sh) the long tests start early and the short ones fill the end."""

import pytest

from conftest import slow_modules_first


class Item:
    """What slow_modules_first reads of a collected test: its node id and its `slow` mark."""

    def __init__(self, nodeid: str, slow: bool = False):
        self.nodeid = nodeid
        self.slow = slow

    def get_closest_marker(self, name: str):
        return pytest.mark.slow if name == "slow" and self.slow else None


def test_modules_with_more_slow_tests_come_first_each_kept_whole_and_in_order():
    items = [Item("tests/test_a.py::one"), Item("tests/test_a.py::two"),
             Item("tests/test_b.py::one", slow=True), Item("tests/test_b.py::two"),
             Item("tests/test_c.py::one[x]", slow=True), Item("tests/test_c.py::one[y]", slow=True),
             Item("tests/test_d.py::one")]  # fmt: skip
    ordered = [item.nodeid for item in slow_modules_first(items)]
    assert ordered == ["tests/test_c.py::one[x]", "tests/test_c.py::one[y]", "tests/test_b.py::one",
                       "tests/test_b.py::two", "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_d.py::one"]
    assert sorted(ordered) == sorted(item.nodeid for item in items)  # every test once


def test_the_suite_is_collected_in_that_order(request):
    """This session's own collection: no module split, slow counts never increasing from one module to the next."""
    modules, counts = [], {}
    for item in request.session.items:
        module = item.nodeid.split("::")[0]
        if not modules or modules[-1] != module:
            assert module not in modules, f"{module} split in the collection order"
            modules.append(module)
        counts[module] = counts.get(module, 0) + bool(item.get_closest_marker("slow"))
    slow = [counts[m] for m in modules]
    assert slow == sorted(slow, reverse=True), list(zip(modules, slow))
