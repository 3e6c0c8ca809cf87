-- Decisions at scale (issue 34): a message's candidates are its thread's followers
-- at level `all` (and the mentioned, read by key). A popular thread has thousands of
-- follows, most of them at `mentions`; the round reads only the `all` ones, from
-- this index alone (an index-only scan, one range per thread), instead of every
-- follow of the thread.
CREATE INDEX follows_all ON bothy.follows (thread_id, user_id) WHERE level = 'all';
