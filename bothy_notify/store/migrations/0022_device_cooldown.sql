-- The 4029 cooldown where every process and node sees it (issue 30): a device
-- closed with 4029 ("too many frames") is refused at identify until its
-- connection's bucket would have filled up again. The end is written on the
-- device's row (which identify writes anyway) in the database's clock, so a
-- device that reconnects to another process or node of the cluster is refused
-- there too. NULL: never closed with 4029.
ALTER TABLE bothy.devices ADD COLUMN cooldown_until timestamptz;
