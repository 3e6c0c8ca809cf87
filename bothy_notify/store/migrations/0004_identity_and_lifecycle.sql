-- Identity per person and an outage-safe token lifecycle.
--
-- 1. A device is identified by (person, device id): two people whose tokens
--    carry the same device id have two device rows, and their registrations
--    join their own device only.
-- 2. Registrations are unique on (provider, owner scope, SHA-256 of the token):
--    the owner scope is the person for webhooks (a webhook URL never moves
--    between people, a second person gets a registration of their own) and ''
--    for device tokens (an APNs or FCM token registered by another person
--    moves to the caller). Indexing the digest instead of the token means no
--    token length can exceed the index row size.
-- 3. Strikes: at most one per push.strike_interval (last_strike_at), and only
--    while the same provider delivered to other registrations in that interval
--    (provider_deliveries, shared by every node).

ALTER TABLE bothy.devices DROP CONSTRAINT devices_pkey;
ALTER TABLE bothy.devices ADD PRIMARY KEY (user_id, device_id);
DROP INDEX bothy.devices_user;  -- the primary key leads with user_id

DROP INDEX bothy.push_registrations_device;
CREATE INDEX push_registrations_device ON bothy.push_registrations (user_id, device_id);

ALTER TABLE bothy.push_registrations
    ADD COLUMN token_digest bytea,
    ADD COLUMN owner_scope text NOT NULL
        GENERATED ALWAYS AS (CASE WHEN provider = 'webhook' THEN user_id ELSE '' END) STORED,
    ADD COLUMN last_strike_at timestamptz;

-- The digest is kept by a trigger, so every writer (the API, tools, benchmarks)
-- stores it the same way; textsend/convert_to are not immutable, so it cannot
-- be a generated column.
CREATE FUNCTION bothy.push_registration_digest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.token_digest := sha256(convert_to(NEW.token, 'UTF8'));
    RETURN NEW;
END;
$$;
CREATE TRIGGER push_registrations_digest
    BEFORE INSERT OR UPDATE OF token ON bothy.push_registrations
    FOR EACH ROW EXECUTE FUNCTION bothy.push_registration_digest();

UPDATE bothy.push_registrations SET token_digest = sha256(convert_to(token, 'UTF8'));
ALTER TABLE bothy.push_registrations ALTER COLUMN token_digest SET NOT NULL;
ALTER TABLE bothy.push_registrations DROP CONSTRAINT push_registrations_provider_token_key;
CREATE UNIQUE INDEX push_registrations_token
    ON bothy.push_registrations (provider, owner_scope, token_digest);

-- The newest delivery per provider (any registration), written with the
-- runner's results; a failed send strikes only when this is recent and newer
-- than the registration's own last delivery.
CREATE TABLE bothy.provider_deliveries (
    provider     text PRIMARY KEY,
    delivered_at timestamptz NOT NULL
);
