-- Clear-on-read (issue 20): a push mark says that a registration was delivered a
-- push for a thread since its previous clear. A read of that thread elsewhere
-- sends one notify.push_clear to each marked registration (clear_pending: one is
-- queued and not yet run, so a burst of reads queues one), and its delivery
-- removes the mark. Marks go with their registration.
CREATE TABLE bothy.push_marks (
    registration_id text NOT NULL REFERENCES bothy.push_registrations (id) ON DELETE CASCADE,
    thread_id       text NOT NULL,
    user_id         text NOT NULL,
    marked_at       timestamptz NOT NULL,
    clear_pending   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (registration_id, thread_id)
);
CREATE INDEX push_marks_reader ON bothy.push_marks (user_id, thread_id);
