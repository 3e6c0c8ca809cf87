"""The Matrix push gateway's registrations (SPEC section 14c).

A homeserver names a device by its pusher's ``(app_id, pushkey)``. The gateway
stores each pushkey it is asked to push to as a registration of the provider its
app maps to (``[matrix_gateway] apps``), created on first notify, owned by the
app's principal (``matrix-gateway/<app id>``, a ``/`` no person's id can hold;
its scope is its own, see migration 0027), so the token lifecycle of every push
applies: deliveries, strikes, invalidation on a dead answer, and the answer's
``rejected`` of a pushkey declared gone earlier.

:func:`pushkeys` (one statement, and a second only when some rows must change):

- a pushkey new to the gateway gets its registration;
- a known one is renewed at most once per ``renew_after`` (so
  ``push.registration_ttl`` never sweeps a pushkey in use, and a notify usually
  writes nothing), and takes the key material, app and environment it is sent
  with now (a Web Push pusher's keys, a changed ``apps`` entry);
- an invalidated one is **gone** (the answer lists it in ``rejected`` and nothing
  is sent) unless the homeserver set its pusher after the invalidation
  (``pushkey_ts``), or the hourly sweep invalidated it for want of renewal: it is
  then restored, its errors cleared, like a device registering again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson

from bothy_notify.kernel.ids import new_id
from bothy_notify.store.db import Conn

NOT_RENEWED = "not_renewed"
"""The error of a registration the hourly sweep invalidated (``store.registrations``)."""


@dataclass(frozen=True, slots=True)
class Pushkey:
    """One device of a notify request, as its registration stores it.

    Attributes:
        owner: the Matrix app's principal (``matrix-gateway/<app id>``).
        device_id: the Matrix app id (the registration's device).
        provider: the provider the app maps to.
        token: the registration's token (the pushkey, or a Web Push endpoint).
        app_id: the provider's app (``None``: its block's one app).
        environment: the registration environment (APNs).
        secret: the key material (a Web Push subscription's keys).
        expires_at: the registration's own expiry.
        pushkey_ts: when the homeserver set the pusher (``None``: not said).
    """

    owner: str
    device_id: str
    provider: str
    token: str
    app_id: str | None = None
    environment: str | None = None
    secret: str | None = None
    expires_at: datetime | None = None
    pushkey_ts: datetime | None = None

    def __repr__(self) -> str:
        return f"Pushkey(provider={self.provider!r})"


@dataclass(frozen=True, slots=True)
class Known:
    """A pushkey's registration: its id, and whether it is gone (declared gone by its
    provider, now or before, and not set again since)."""

    registration_id: str
    gone: bool


_FIELDS = "i int, n text, u text, d text, p text, t text, a text, e text, k text, x timestamptz"
_FOUND = (
    "r.id, r.invalidated_at, r.last_error, r.renewed_at, r.app_id, r.environment,"
    " r.signing_key, r.expires_at"
)


def pushkeys(
    conn: Conn, found: Sequence[Pushkey], now: datetime, *, renew_after: timedelta
) -> list[Known]:
    """The registration of each pushkey of ``found``, in order, made or updated as the
    module docstring says (autocommit statements, or the caller's transaction)."""
    if not found:
        return []
    ids = [new_id() for _ in found]
    rows = orjson.dumps(
        [
            {
                "i": i,
                "n": ids[i],
                "u": p.owner,
                "d": p.device_id,
                "p": p.provider,
                "t": p.token,
                "a": p.app_id,
                "e": p.environment,
                "k": p.secret,
                "x": p.expires_at,
            }
            for i, p in enumerate(found)
        ]
    ).decode()
    read = conn.execute(
        f"WITH d AS (SELECT * FROM json_to_recordset(%s::json) AS x({_FIELDS})),"
        " ins AS (INSERT INTO bothy.push_registrations (id, user_id, device_id, provider,"
        "  token, environment, app_id, signing_key, created_at, renewed_at, expires_at)"
        "  SELECT n, u, d, p, t, e, a, k, %s, %s, x FROM d ORDER BY i"
        "  ON CONFLICT (provider, owner_scope, token_digest) DO NOTHING RETURNING id)"
        f" SELECT d.i, {_FOUND}, ins.id IS NOT NULL FROM d"
        " LEFT JOIN ins ON ins.id = d.n"
        " LEFT JOIN LATERAL (SELECT * FROM bothy.push_registrations r"
        "  WHERE r.provider = d.p AND r.owner_scope = d.u"
        "  AND r.token_digest = sha256(convert_to(d.t, 'UTF8')) OFFSET 0) r ON true",
        (rows, now, now),
    ).fetchall()
    by_index: dict[int, tuple[object, ...]] = {}
    missing: list[int] = []
    for row in read:
        if row[-1]:  # inserted now: active, nothing to compare
            p = found[row[0]]
            by_index[row[0]] = (
                ids[row[0]],
                None,
                None,
                now,
                p.app_id,
                p.environment,
                p.secret,
                p.expires_at,
            )
        elif row[1] is None:
            # Another request inserted it after this statement's snapshot: read it again.
            missing.append(row[0])
        else:
            by_index[row[0]] = tuple(row[1:-1])
    if missing:
        for index in missing:
            p = found[index]
            again = conn.execute(
                f"SELECT {_FOUND} FROM bothy.push_registrations r WHERE r.provider = %s"
                " AND r.owner_scope = %s AND r.token_digest = sha256(convert_to(%s, 'UTF8'))",
                (p.provider, p.owner, p.token),
            ).fetchone()
            assert again is not None, "a registration inserted concurrently is committed"
            by_index[index] = tuple(again)
    out: list[Known] = []
    changes: list[dict[str, object]] = []
    for index, p in enumerate(found):
        (reg_id, invalidated, error, renewed, app_id, env, secret, expires) = by_index[index]
        assert isinstance(reg_id, str)
        gone = False
        restore = False
        if isinstance(invalidated, datetime):
            set_again = p.pushkey_ts is not None and p.pushkey_ts > invalidated
            restore = set_again or error == NOT_RENEWED
            gone = not restore
        stale = isinstance(renewed, datetime) and renewed < now - renew_after
        differs = (app_id, env, secret, expires) != (
            p.app_id,
            p.environment,
            p.secret,
            p.expires_at,
        )
        if not gone and (restore or stale or differs):
            changes.append(
                {
                    "id": reg_id,
                    "a": p.app_id,
                    "e": p.environment,
                    "k": p.secret,
                    "x": p.expires_at,
                    "r": restore,
                }
            )
        out.append(Known(reg_id, gone))
    if changes:
        conn.execute(
            "UPDATE bothy.push_registrations r SET renewed_at = %s, app_id = c.a,"
            " environment = c.e, signing_key = c.k, expires_at = c.x,"
            " invalidated_at = CASE WHEN c.r THEN NULL ELSE r.invalidated_at END,"
            " failure_count = CASE WHEN c.r THEN 0 ELSE r.failure_count END,"
            " last_error = CASE WHEN c.r THEN NULL ELSE r.last_error END,"
            " last_error_at = CASE WHEN c.r THEN NULL ELSE r.last_error_at END,"
            " last_strike_at = CASE WHEN c.r THEN NULL ELSE r.last_strike_at END"
            " FROM json_to_recordset(%s::json)"
            "  AS c(id text, a text, e text, k text, x timestamptz, r boolean)"
            " WHERE r.id = c.id",
            (now, orjson.dumps(sorted(changes, key=lambda c: str(c["id"]))).decode()),
        )
    return out


def gone(conn: Conn, registration_ids: Sequence[str]) -> set[str]:
    """Which of ``registration_ids`` are invalidated now (a dead answer's effect, committed
    with its job's result; the gateway's answer from another node's runner)."""
    if not registration_ids:
        return set()
    rows = conn.execute(
        "SELECT id FROM bothy.push_registrations WHERE id = ANY(%s) AND invalidated_at IS NOT NULL",
        (list(registration_ids),),
    ).fetchall()
    return {str(r[0]) for r in rows}


@dataclass(frozen=True, slots=True)
class FirstAttempt:
    """What the database says of a gateway job's first attempt, once it is recorded:
    whether its registration is gone now, whether it delivered, and whether the job
    waits for a retry (a transient failure)."""

    gone: bool
    delivered: bool
    retrying: bool


def first_attempts(conn: Conn, job_ids: Sequence[int]) -> dict[int, FirstAttempt]:
    """The jobs of ``job_ids`` whose first attempt is recorded (finished, or waiting for
    its retry), by id; one statement. A job run by another node's runner is answered
    from here (the effects of its result commit with it)."""
    if not job_ids:
        return {}
    rows = conn.execute(
        "SELECT j.id, r.invalidated_at IS NOT NULL,"
        " coalesce(r.last_seen_at >= j.created_at, false), j.state = 'available'"
        " FROM bothy.jobs j JOIN bothy.push_registrations r ON r.id = j.args->>'registration_id'"
        " WHERE j.id = ANY(%s) AND (j.state IN ('completed', 'failed')"
        "  OR (j.state = 'available' AND j.attempt >= 1))",
        (list(job_ids),),
    ).fetchall()
    return {int(r[0]): FirstAttempt(bool(r[1]), bool(r[2]), bool(r[3])) for r in rows}
