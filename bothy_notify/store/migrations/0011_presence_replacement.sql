-- A device holds one connection in a cluster too (cluster.mode = "multi";
-- SPEC section 8.6, docs/operations.md "Several nodes"): when it goes live on a
-- second node while its older connection on another node is still open (it
-- moved, or a client opened two), the older one closes with 4017, as on one
-- node.
--
-- conn_serial is the holding node's own number of the connection (the hub's
-- serial), so the node told to close it closes exactly that one. live_seq
-- orders the connections of one device across nodes: a row takes the next
-- value when it is written for a connection it did not describe before (a new
-- row, or the node's newer connection of the device), and keeps it while only
-- that connection's focus or idle changes. The lower live_seq is the older
-- connection. Neither is a fact of the person; both are worthless after a
-- crash, like the rest of the table.
CREATE SEQUENCE bothy.presence_live_seq;
ALTER TABLE bothy.presence
    ADD COLUMN conn_serial bigint NOT NULL DEFAULT 0,
    ADD COLUMN live_seq bigint NOT NULL DEFAULT 0;
