"""Process exit of the test run.

Native threads left by the libraries under test (Ray's core worker, gloo, Triton) have crashed the
interpreter's own teardown with a segmentation fault after every test had passed (1 run in 4 on
the 2-core CI machine), turning a green run red. The run's result is final once pytest has written
its summary, so the process exits there with pytest's own status and skips that teardown.
"""

import itertools
import os
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = config.stash.get(_EXIT_STATUS, None)
    if status is not None and os.environ.get("DISTRIBUTED_SPEC_TEST_NORMAL_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.fixture
def steady_steps(monkeypatch):
    """Every step lasts one tick of a fake clock, whatever its g. On tiny models a draft forward costs
    as much as the target's, so the goodput schedule rightly stops drafting after its probe; tests
    that check exactness under that schedule need the drafting path taken, and with steps of equal
    cost drafting always pays."""
    from distributed_spec.engine.scheduler import Scheduler

    ticks = itertools.count()
    monkeypatch.setattr(Scheduler, "clock", staticmethod(lambda: float(next(ticks))))
