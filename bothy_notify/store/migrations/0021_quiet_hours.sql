-- Quiet hours, do-not-disturb and snooze (issue 20). A person's settings are one
-- document, as GET /v1/quiet-hours answers it (no row: UTC, no schedule, no
-- snooze, no breakthrough). summary_key is the unique key of the person's
-- pending notify.quiet_summary (NULL: none pending), so a change of the
-- settings can move it to the new end of the quiet period.
CREATE TABLE bothy.quiet_hours (
    user_id     text PRIMARY KEY,
    doc         jsonb NOT NULL,
    updated_at  timestamptz NOT NULL,
    summary_key text
);

-- A push held while its person was quiet: one row per thread (item = the thread
-- id; a hint without a thread: its nid), with the thread's last message at the
-- time it was held. The quiet period's summary takes them all and mentions a
-- thread only if its read position is still before that message.
CREATE TABLE bothy.held_pushes (
    user_id   text NOT NULL,
    item      text NOT NULL,
    thread_id text,
    seq       bigint NOT NULL DEFAULT 0,
    category  text NOT NULL,
    held_at   timestamptz NOT NULL,
    PRIMARY KEY (user_id, item)
);
