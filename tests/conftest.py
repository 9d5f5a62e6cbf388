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


@pytest.fixture
def scripted_goodput(monkeypatch):
    """Replace the goodput schedule's choice with a script: `scripted_goodput(pattern, probe_rows)`,
    pattern[i] = (g, measuring) or (g, measuring, model_drafts) for step i + 1 (measuring: the
    scheduler lets only probe_rows rows draft; model_drafts False: n-gram blocks alone, default True).
    Returns the list the debt offered at each step is appended to."""
    from distributed_spec.engine.goodput import GoodputPolicy

    debts = []

    def install(pattern, probe_rows=None):
        def scripted(self, rows, num_rows, debt_per_token=0.0):
            self.num_steps += 1
            debts.append(debt_per_token)
            g, self.measuring, *model_drafts = pattern[self.num_steps - 1]
            self.model_drafts = model_drafts[0] if model_drafts else True
            return g

        monkeypatch.setattr(GoodputPolicy, "choose_step", scripted)
        if probe_rows is not None:
            post_init = GoodputPolicy.__post_init__

            def with_probe_rows(self):
                post_init(self)
                self.probe_rows = probe_rows

            monkeypatch.setattr(GoodputPolicy, "__post_init__", with_probe_rows)
        return debts

    return install
