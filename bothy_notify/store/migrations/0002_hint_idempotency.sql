-- App-requested hints (hint.requested): at most one hint per (dedupe key,
-- recipient) within notify.idempotency_window, however often the producer
-- retries. The key is "key|<idempotency_key>" when the producer gave one, else
-- "about|<kind>|<thread_id>|<target_id>". The consumer round reads and writes
-- this table inside its own transaction, with the time of its injected clock;
-- housekeeping deletes rows once they are older than the window.
CREATE TABLE bothy.hint_idempotency (
    dedupe_key text NOT NULL,
    user_id    text NOT NULL,
    seen_at    timestamptz NOT NULL,
    PRIMARY KEY (dedupe_key, user_id)
);
CREATE INDEX hint_idempotency_seen ON bothy.hint_idempotency (seen_at);
