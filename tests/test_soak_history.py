"""The soak's history checker (``bench/_history.py``): histories in, findings out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench._history import PushJob, Send, Stop, check, followers_of

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
FOLLOWERS = {"t0": ["u0", "u2"], "t1": ["u1"]}
"""u0 and u2 follow t0, u1 follows t1."""


def job(id_: int, message: str, user: str, *, state: str = "completed", claim: int = 1) -> PushJob:
    return PushJob(id_, message, user, f"r-{user}", f"n-{message}-{user}", state, 1, claim)


def sent(j: PushJob, node: str = "a", after: float = 0.0) -> Send:
    return Send(node, T0 + timedelta(seconds=after), j.registration_id, j.nid, "message")


def run(jobs: list[PushJob], sends: list[Send], stops: list[Stop] = [], skips: int = 0):  # noqa: B006
    return check(
        accepted={"m1": "t0", "m2": "t1"},
        followers=FOLLOWERS,
        jobs=jobs,
        sends=sends,
        stops=stops,
        skips_counted=skips,
    )


JOBS = [job(1, "m1", "u0"), job(2, "m1", "u2"), job(3, "m2", "u1")]


def test_every_push_sent_once_is_a_clean_history() -> None:
    found = run(JOBS, [sent(j) for j in JOBS])
    assert found.ok
    assert (found.messages, found.expected_pushes, found.sent_once) == (2, 3, 3)


def test_a_follower_without_a_push_job_is_lost() -> None:
    found = run(JOBS[:2], [sent(j) for j in JOBS[:2]])
    assert not found.ok
    assert found.lost == 1 and found.samples["lost"] == ["m2"]


def test_two_jobs_for_one_message_and_follower_are_decided_twice() -> None:
    twice = [*JOBS, job(4, "m2", "u1")]
    found = run(twice, [sent(j) for j in twice])
    assert found.decided_twice == 1 and not found.ok


def test_a_job_still_running_is_unfinished() -> None:
    jobs = [*JOBS[:2], job(3, "m2", "u1", state="running")]
    found = run(jobs, [sent(j) for j in JOBS[:2]])
    assert found.unfinished == 1 and not found.ok


def test_a_completed_job_without_a_send_is_a_skip_the_nodes_must_have_counted() -> None:
    sends = [sent(j) for j in JOBS[:2]]
    assert run(JOBS, sends, skips=1).ok
    uncounted = run(JOBS, sends, skips=0)
    assert uncounted.skipped == 1 and uncounted.unexplained_skips == 1 and not uncounted.ok


def test_a_second_send_across_a_graceful_stop_fails_the_history() -> None:
    sends = [sent(j) for j in JOBS] + [sent(JOBS[0], node="b", after=10)]
    found = run(JOBS, sends, [Stop("a", "SIGTERM", T0 + timedelta(seconds=5))])
    assert found.duplicates_graceful == 1 and not found.ok


def test_a_second_send_across_a_kill_is_explained_by_a_second_claim() -> None:
    again = [job(1, "m1", "u0", claim=2), *JOBS[1:]]
    sends = [sent(j) for j in again] + [sent(again[0], node="b", after=10)]
    found = run(again, sends, [Stop("a", "SIGKILL", T0 + timedelta(seconds=5))])
    assert found.duplicates_after_kill == 1 and found.ok


def test_a_second_send_across_a_kill_without_a_second_claim_is_unexplained() -> None:
    sends = [sent(j) for j in JOBS] + [sent(JOBS[0], node="b", after=10)]
    found = run(JOBS, sends, [Stop("a", "SIGKILL", T0 + timedelta(seconds=5))])
    assert found.duplicates_unexplained == 1 and not found.ok


def test_a_second_send_with_no_stop_between_is_unexplained() -> None:
    sends = [sent(j) for j in JOBS] + [sent(JOBS[0], after=10)]
    found = run(JOBS, sends, [Stop("b", "SIGTERM", T0 + timedelta(seconds=5))])
    assert found.duplicates_unexplained == 1 and not found.ok


def test_a_send_no_job_decided_fails_the_history() -> None:
    stray = Send("a", T0, "r-u9", "n-m9-u9", "message")
    found = run(JOBS, [*(sent(j) for j in JOBS), stray])
    assert found.sent_undecided == 1 and not found.ok


def test_clearing_pushes_are_not_hint_sends() -> None:
    clear = Send("a", T0, "r-u0", "n-x", "read")
    assert run(JOBS, [*(sent(j) for j in JOBS), clear]).ok


def test_the_soak_world_follows_one_thread_each() -> None:
    assert followers_of(5, 2) == {"t0": ["u0", "u2", "u4"], "t1": ["u1", "u3"]}
