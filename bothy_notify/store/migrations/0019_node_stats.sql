-- The operator's status page (GET /admin over GET /v1/admin/status) shows every
-- live node of a cluster: each node writes what only it knows (connections by
-- phase, whether it holds the round, its provider sends of the last minutes,
-- its skips by reason) with its heartbeat, as aggregates only: counts by
-- closed label sets, never a person, device, thread, token or URL.
ALTER TABLE bothy.nodes ADD COLUMN stats jsonb;
