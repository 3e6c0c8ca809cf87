-- Quiet hours' settings as json, not jsonb (issue 30). The round reads the whole
-- document of every recipient with settings (notify/facts.py), as text: from
-- jsonb PostgreSQL rebuilds that text each time (about 10 us of its CPU per
-- document of 14 entries), from json it hands over the stored text. Nothing
-- queries inside the document.
ALTER TABLE bothy.quiet_hours ALTER COLUMN doc TYPE json USING doc::json;
