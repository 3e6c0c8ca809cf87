-- Several nodes on one database (cluster.mode = "multi"; docs/operations.md,
-- "Several nodes").
--
-- bothy.nodes is the node registry: one row per running node process (a new
-- UUIDv7 at every start), its heartbeat written every server.heartbeat with the
-- node's injected clock. A node whose seen_at is older than
-- cluster.node_timeout is gone: its presence no longer counts and jobs
-- targeted at it end as node_gone.
--
-- bothy.presence holds the presence facts of SPEC section 6 (device,
-- platform, focus, idle) of every live connection, published in batches by
-- the gateway node that holds it. Nothing else: no address, no token, no time
-- of the person's.
--
-- Both tables are UNLOGGED: they are rewritten every few seconds, need no WAL,
-- and are worthless after a crash. PostgreSQL empties them after a crash (and a
-- standby never has them); every node then finds its row missing at its next
-- heartbeat, inserts it again and publishes its whole presence again.
CREATE UNLOGGED TABLE bothy.nodes (
    node_id    uuid PRIMARY KEY,
    role       text NOT NULL CHECK (role IN ('all', 'worker', 'api')),
    host       text NOT NULL,
    pid        integer NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL
);

CREATE UNLOGGED TABLE bothy.presence (
    user_id    text NOT NULL,
    device_id  text NOT NULL,
    node_id    uuid NOT NULL,
    platform   text NOT NULL,
    focus      text[] NOT NULL,
    idle       boolean NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, device_id, node_id)
);
CREATE INDEX presence_node ON bothy.presence (node_id);

-- A job with node_id set runs only on that node (notify.gateway_send goes to
-- the node holding the person's connections); NULL runs anywhere.
ALTER TABLE bothy.jobs ADD COLUMN node_id uuid;
CREATE INDEX jobs_targeted ON bothy.jobs (node_id)
    WHERE node_id IS NOT NULL AND state IN ('available', 'running');
