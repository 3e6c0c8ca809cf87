-- Nothing stops the round, nothing is applied twice.

-- Fencing: every claim of a job takes the next claim number, and every result
-- (complete, fail, retry, defer, renew, release) names the claim it belongs to.
-- A runner that lost its lease, after another runner claimed the job again,
-- matches no row: its result and its effects are dropped. Unlike "attempt",
-- which a deferral or a release gives back, the claim number never goes down.
ALTER TABLE bothy.jobs ADD COLUMN claim bigint NOT NULL DEFAULT 0;

-- Events the consumer round could not apply or decide (an unknown type, a
-- payload the projection cannot apply, a bug). The event itself stays in
-- bothy.events; this row says where it is and what went wrong, by type only
-- (never a payload or a message that could quote one). `bothy-notify events
-- retry` replays a row and deletes it once the replay commits.
CREATE TABLE bothy.dead_letters (
    seq             bigint PRIMARY KEY,
    xid             xid8 NOT NULL,
    type            text NOT NULL,
    error_type      text NOT NULL,
    error_where     text NOT NULL DEFAULT '',
    dead_lettered_at timestamptz NOT NULL,
    retries         integer NOT NULL DEFAULT 0,
    last_retry_at   timestamptz
);

-- Idempotent appends: POST /v1/events with an Idempotency-Key. One row per
-- (producer sub, key): the hash of the batch it came with and the seqs it got.
-- A retry with the same key and body answers the same seqs and appends
-- nothing; rows older than server.idempotency_window are pruned by housekeeping.
CREATE TABLE bothy.append_keys (
    producer     text NOT NULL,
    key          text NOT NULL,
    request_hash bytea NOT NULL,
    seqs         bigint[] NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (producer, key)
);
CREATE INDEX append_keys_created ON bothy.append_keys (created_at);
