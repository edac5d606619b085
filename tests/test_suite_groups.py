"""The suite's xdist groups are in effect: under `--dist loadgroup` (scripts/test.sh) a test marked
`xdist_group` carries its group in its node id, which is what sends the group's tests to one worker
(and builds their module and session fixtures once). pytest-xdist 3.8 over pytest 9.2 drops the mark
silently; this test then fails instead."""

import pytest


@pytest.mark.xdist_group("suite_groups")
def test_a_grouped_test_carries_its_group_under_loadgroup(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not an xdist worker of --dist loadgroup (scripts/test.sh runs one)")
    assert request.node.nodeid.endswith("@suite_groups"), request.node.nodeid
