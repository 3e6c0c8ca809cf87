"""Which lease renewals count as a lost lease (``runner.lost_leases``).

A renewal matches only jobs still ``running`` under this runner's claim, so a
job whose result was recorded while the renewal ran is missed by it without
having lost anything; before, every such job was reported as "lost their
lease while running; another claim holds them" (seen in ``bench/gateway.py``
at 200 hints/s). A job counts as lost when two renewals in a row missed it and
it is still running here.
"""

from __future__ import annotations

from bothy_notify.runner import lost_leases


def test_a_job_recorded_while_its_renewal_ran_has_not_lost_its_lease() -> None:
    a, b = (1, 1), (2, 1)
    # The renewal missed a: its result was being recorded meanwhile (no longer running).
    lost, missed = lost_leases([a, b], held={b}, missed_before=set(), running={b})
    assert lost == set() and missed == set()
    # Even while it was still in flight here: one miss proves nothing.
    lost, missed = lost_leases([a, b], held={b}, missed_before=set(), running={a, b})
    assert lost == set() and missed == {a}


def test_a_job_still_running_that_two_renewals_missed_lost_its_lease() -> None:
    a, b = (1, 1), (2, 1)
    lost, missed = lost_leases([a, b], held={b}, missed_before={a}, running={a, b})
    assert lost == {a} and missed == {a}
    # Recorded by the next renewal after one miss: it was not lost.
    lost, missed = lost_leases([b], held={b}, missed_before={a}, running={b})
    assert lost == set() and missed == set()
