-- Providers in one table (bothy_notify/push/providers.py) and Web Push.
--
-- 1. A registration's own expiry: a Web Push subscription's expirationTime. A
--    send after it invalidates the registration without contacting anyone. Web
--    Push keeps the subscription's keys (p256dh, auth) in signing_key, the
--    registration's key material that is never returned.
-- 2. The channels a topic-mode recipient may use are the provider table's,
--    checked when it registers; the column no longer repeats that list, so a
--    new channel needs no migration.

ALTER TABLE bothy.push_registrations ADD COLUMN expires_at timestamptz;

ALTER TABLE bothy.topic_recipients DROP CONSTRAINT topic_recipients_channel_check;
ALTER TABLE bothy.topic_recipients
    ADD CONSTRAINT topic_recipients_channel_name CHECK (channel ~ '^[a-z][a-z0-9_]{0,31}$');
