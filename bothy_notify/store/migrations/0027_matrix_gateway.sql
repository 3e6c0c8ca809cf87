-- The Matrix push gateway (SPEC section 14c). A homeserver's pushkeys are stored
-- as registrations of the provider their app maps to, owned by a principal of the
-- daemon's own per Matrix app: "matrix-gateway/<app id>". No person can have that
-- id (a "/" is outside the app ID form), so these registrations never receive a
-- person's hints. They must not move to a person either, nor a person's token to
-- them, when an app registers the same token both ways: a principal whose id
-- holds a "/" scopes its tokens to itself, as a webhook's person does.
DROP INDEX bothy.push_registrations_token;
ALTER TABLE bothy.push_registrations DROP COLUMN owner_scope;
ALTER TABLE bothy.push_registrations ADD COLUMN owner_scope text NOT NULL
    GENERATED ALWAYS AS (
        CASE WHEN provider = 'webhook' OR strpos(user_id, '/') > 0 THEN user_id ELSE '' END
    ) STORED;
CREATE UNIQUE INDEX push_registrations_token
    ON bothy.push_registrations (provider, owner_scope, token_digest);
