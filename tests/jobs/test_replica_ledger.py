"""The driver's ledger of records handed to replicas: each result accepted once, nothing lost when a
replica dies, whether or not it reported what it took (jobs/replica_ledger.py)."""

from __future__ import annotations

from distributed_spec.jobs.replica_ledger import WorkLedger

A, B, DEAD_A = (0, 0), (1, 0), {(0, 0)}


def _ledger(num_records: int) -> tuple[WorkLedger, list[int]]:
    ledger = WorkLedger()
    keys = [ledger.add(f"record {index}") for index in range(num_records)]
    for key in keys:
        ledger.put(key)
    return ledger, keys


def test_a_result_is_accepted_once():
    ledger, keys = _ledger(2)
    ledger.taken(keys[0], A)
    assert ledger.done(keys[0]) == "record 0"
    assert ledger.done(keys[0]) is None
    ledger.taken(keys[0], B)  # a late report of a finished record changes nothing
    assert ledger.holders == {} and ledger.num_outstanding == 1


def test_a_dead_replicas_records_are_lost_and_nobody_elses():
    ledger, keys = _ledger(6)
    ledger.taken(keys[0], A)
    ledger.taken(keys[1], B)
    ledger.taken(keys[2], A)
    ledger.done(keys[2])
    # Four records left the queue (keys 0-3); key 3 was taken but its report never came.
    lost = ledger.lost(DEAD_A, num_taken=4)
    assert sorted(lost) == [keys[0], keys[3]]
    assert ledger.holders == {keys[1]: B}


def test_records_queued_again_count_from_their_latest_put():
    ledger, keys = _ledger(3)
    ledger.taken(keys[0], A)
    assert ledger.lost(DEAD_A, num_taken=1) == [keys[0]]
    ledger.put(keys[0])  # queued again, behind keys 1 and 2
    # B takes keys 1 and 2 and reports them; key 0 is still in the queue.
    ledger.taken(keys[1], B)
    ledger.taken(keys[2], B)
    assert ledger.lost(DEAD_A | {(0, 1)}, num_taken=3) == []
    assert ledger.lost({B}, num_taken=3) == [keys[1], keys[2]]


def test_stop_markers_hold_their_place_in_the_queue():
    ledger, keys = _ledger(1)
    ledger.put(None)
    ledger.put(keys[0])
    # Two puts taken: the first put of key 0 and the stop; key 0's latest put is still queued.
    assert ledger.lost(DEAD_A, num_taken=2) == []
    assert ledger.lost(DEAD_A, num_taken=3) == [keys[0]]
