-- What conversations do after a message is written (issue 33).
--
-- A deleted message (message.deleted) is recorded by (thread, message) with its
-- sequence and the time of its deletion, so that nothing not yet sent for it goes
-- out (jobs are skipped `deleted`) and a coalescing window's flush that would count
-- only deleted messages says nothing. Rows are kept for
-- max(push.max_age, notify.coalesce_window) after the deletion (housekeeping): no
-- job of the message can be pending longer. No message text, no mention list.
CREATE TABLE bothy.deleted_messages (
    thread_id  text NOT NULL,
    message_id text NOT NULL,
    seq        bigint NOT NULL,
    deleted_at timestamptz NOT NULL,
    PRIMARY KEY (thread_id, message_id)
);
CREATE INDEX deleted_messages_at ON bothy.deleted_messages (deleted_at);

-- The thread's latest deletion still kept (NULL: none): a send job, which reads
-- its thread's row anyway, looks for its message among the deleted ones only when
-- this is set, so sends in threads without deletions read nothing more. (No index:
-- only the hourly sweep asks for it.)
ALTER TABLE bothy.threads ADD COLUMN deleted_at timestamptz;

-- A registration pushed for a thread since its last clear gets one `removed` push
-- per burst of deletions in the thread: removed_pending says one is queued and not
-- yet run (as clear_pending does for reads).
-- A deletion finds a thread's marks by the thread: the reader index turns round to
-- (thread, person), which still serves a read's lookup of (person, thread), so a
-- delivered push maintains as many indexes as before.
ALTER TABLE bothy.push_marks ADD COLUMN removed_pending boolean NOT NULL DEFAULT false;
CREATE INDEX push_marks_thread_user ON bothy.push_marks (thread_id, user_id);
DROP INDEX bothy.push_marks_reader;
