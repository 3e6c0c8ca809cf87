-- Topic mode (end-to-end-encrypted apps, docs/topics.md): anonymous recipients
-- and their topic subscriptions. Envelopes are events of type
-- "envelope.published" in bothy.events; nothing about them is stored here.

-- A recipient: a 32-byte random id and the SHA-256 of its 32-byte secret (the
-- secret itself is never stored), how to reach it, and when it last renewed.
-- Deleted (never invalidated) on a terminal provider answer, on unregister, and
-- by the hourly sweep once renewed_at is older than push.recipient_ttl; the
-- cascade removes its subscriptions.
CREATE TABLE bothy.topic_recipients (
    recipient_id bytea PRIMARY KEY CHECK (length(recipient_id) = 32),
    secret_hash  bytea NOT NULL CHECK (length(secret_hash) = 32),
    channel      text NOT NULL CHECK (channel IN ('apns', 'fcm', 'webhook', 'fake')),
    -- The delivery config: the device token, or the webhook's https URL, with the
    -- APNs environment and the webhook signing key. A terminal answer deletes the
    -- recipient only while these still equal what the send used.
    delivery     text NOT NULL,
    environment  text CHECK (environment IN ('sandbox', 'production')),
    signing_key  bytea CHECK (signing_key IS NULL OR length(signing_key) BETWEEN 16 AND 64),
    -- Equal to the number of its subscription rows after every mutation.
    topic_count  integer NOT NULL DEFAULT 0 CHECK (topic_count >= 0),
    created_at   timestamptz NOT NULL,
    renewed_at   timestamptz NOT NULL
);
CREATE INDEX topic_recipients_renewed ON bothy.topic_recipients (renewed_at);

-- One (recipient, topic) pair. since_xid is the start position: the event log's
-- settled position (pg_snapshot_xmin) when the subscription was first stored;
-- an envelope whose transaction id is below it is never pushed to this
-- subscription (see docs/topics.md, "Start positions"). The key window holds up
-- to three HMAC-SHA256 keys for consecutive 30-day epochs from hmac_epoch_base,
-- each stored as its 64-byte inner pad followed by its 64-byte outer pad, so
-- that the sender check runs in SQL with the built-in sha256().
CREATE TABLE bothy.topic_subscriptions (
    recipient_id    bytea NOT NULL REFERENCES bothy.topic_recipients ON DELETE CASCADE,
    topic           bytea NOT NULL,
    since_xid       xid8 NOT NULL,
    include_commits boolean NOT NULL DEFAULT false,
    hmac_epoch_base bigint CHECK (hmac_epoch_base >= 0),
    hmac_pads_0     bytea CHECK (length(hmac_pads_0) = 128),
    hmac_pads_1     bytea CHECK (length(hmac_pads_1) = 128),
    hmac_pads_2     bytea CHECK (length(hmac_pads_2) = 128),
    PRIMARY KEY (recipient_id, topic)
);
-- The dispatch join: every subscription of a topic, in recipient order (pages).
CREATE INDEX topic_subscriptions_topic ON bothy.topic_subscriptions (topic, recipient_id);
