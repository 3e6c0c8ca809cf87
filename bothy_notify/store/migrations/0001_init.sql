-- Bothy Notify: the initial schema. Everything lives in schema "bothy".
-- Times are written from the daemon's injected clock where decisions depend
-- on them (jobs, windows, registrations); events take clock_timestamp().

CREATE SCHEMA IF NOT EXISTS bothy;

-- JSON schema of every event type, synchronised from schemas/events/*.json by
-- every migrate run; append_event validates against it.
CREATE TABLE bothy.event_types (
    type   text PRIMARY KEY,
    schema jsonb NOT NULL
);

-- The event log. "xid" is the appending transaction; the consumer reads only
-- events of transactions older than every running one, in (xid, seq) order, so
-- an event that commits late is never skipped (see docs/architecture.md).
CREATE TABLE bothy.events (
    seq         bigserial PRIMARY KEY,
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    type        text NOT NULL,
    payload     jsonb NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX events_xid_seq ON bothy.events (xid, seq);

CREATE TABLE bothy.consumer_cursor (
    name       text PRIMARY KEY,
    xid        xid8 NOT NULL,
    seq        bigint NOT NULL,
    updated_at timestamptz
);
INSERT INTO bothy.consumer_cursor (name, xid, seq) VALUES ('notify', '0', 0);

CREATE TABLE bothy.users (
    user_id    text PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('human', 'agent', 'app')),
    active     boolean NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE bothy.devices (
    device_id  text PRIMARY KEY,
    user_id    text NOT NULL,
    platform   text NOT NULL CHECK (platform IN ('ios', 'android', 'macos', 'windows', 'linux', 'web')),
    state      text NOT NULL CHECK (state IN ('active', 'pending', 'revoked')),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX devices_user ON bothy.devices (user_id);

CREATE TABLE bothy.threads (
    thread_id        text PRIMARY KEY,
    space_id         text,
    channel_id       text,
    last_message_seq bigint NOT NULL DEFAULT 0,
    unread_floor_seq bigint NOT NULL DEFAULT 0
);

-- Read access: a membership names a thread, its channel or its space.
CREATE TABLE bothy.members (
    scope_id text NOT NULL,
    user_id  text NOT NULL,
    PRIMARY KEY (scope_id, user_id)
);
CREATE INDEX members_user ON bothy.members (user_id);

CREATE TABLE bothy.follows (
    thread_id text NOT NULL,
    user_id   text NOT NULL,
    level     text NOT NULL CHECK (level IN ('all', 'mentions', 'none')),
    PRIMARY KEY (thread_id, user_id)
);
CREATE INDEX follows_user ON bothy.follows (user_id);

CREATE TABLE bothy.read_states (
    user_id       text NOT NULL,
    thread_id     text NOT NULL,
    last_read_seq bigint NOT NULL,
    PRIMARY KEY (user_id, thread_id)
);

CREATE TABLE bothy.preferences (
    user_id    text PRIMARY KEY,
    categories jsonb NOT NULL DEFAULT '{}'
);

CREATE TABLE bothy.push_registrations (
    id             text PRIMARY KEY,
    user_id        text NOT NULL,
    device_id      text NOT NULL,
    provider       text NOT NULL,
    token          text NOT NULL,
    environment    text,
    app_id         text,
    signing_key    text,
    created_at     timestamptz NOT NULL,
    renewed_at     timestamptz NOT NULL,
    last_seen_at   timestamptz,
    last_error_at  timestamptz,
    last_error     text,
    failure_count  integer NOT NULL DEFAULT 0,
    invalidated_at timestamptz,
    UNIQUE (provider, token)
);
CREATE INDEX push_registrations_user ON bothy.push_registrations (user_id) WHERE invalidated_at IS NULL;
CREATE INDEX push_registrations_device ON bothy.push_registrations (device_id);

-- Coalescing: one open window per (recipient, thread).
CREATE TABLE bothy.hint_windows (
    user_id           text NOT NULL,
    thread_id         text NOT NULL,
    opened_at         timestamptz NOT NULL,
    closes_at         timestamptz NOT NULL,
    count             integer NOT NULL,
    first_seq         bigint NOT NULL,
    newest_seq        bigint NOT NULL,
    newest_message_id text NOT NULL,
    mention           boolean NOT NULL DEFAULT false,
    PRIMARY KEY (user_id, thread_id)
);

CREATE TABLE bothy.jobs (
    id           bigserial PRIMARY KEY,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    unique_key   text,
    scheduled_at timestamptz NOT NULL,
    attempt      integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    state        text NOT NULL DEFAULT 'available'
                 CHECK (state IN ('available', 'running', 'completed', 'failed')),
    lease_until  timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL,
    finished_at  timestamptz
);
CREATE UNIQUE INDEX jobs_unique_key ON bothy.jobs (unique_key) WHERE unique_key IS NOT NULL;
CREATE INDEX jobs_available ON bothy.jobs (scheduled_at, id) WHERE state = 'available';
CREATE INDEX jobs_running ON bothy.jobs (lease_until) WHERE state = 'running';
CREATE INDEX jobs_finished ON bothy.jobs (finished_at) WHERE state IN ('completed', 'failed');

CREATE TABLE bothy.secrets (
    id         bigserial PRIMARY KEY,
    name       text NOT NULL,
    value      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz
);
CREATE UNIQUE INDEX secrets_current ON bothy.secrets (name) WHERE retired_at IS NULL;

-- A small validator for the JSON-schema subset used in schemas/events:
-- type, enum, required, properties, additionalProperties=false, pattern,
-- minLength, maxLength, minimum, maximum, items, minItems, maxItems.
-- Returns NULL when "v" is valid, else "<path>: <problem>" (never a value).
CREATE FUNCTION bothy.validate_json(s jsonb, v jsonb, path text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t       text := s ->> 'type';
    k       text;
    sub     jsonb;
    problem text;
    i       integer := 0;
    n       numeric;
BEGIN
    IF t IS NOT NULL THEN
        IF t = 'integer' THEN
            IF jsonb_typeof(v) <> 'number' OR (v::text)::numeric <> trunc((v::text)::numeric) THEN
                RETURN path || ': expected an integer';
            END IF;
        ELSIF jsonb_typeof(v) <> t THEN
            RETURN path || ': expected ' || CASE t WHEN 'object' THEN 'an object'
                                                   WHEN 'array' THEN 'an array'
                                                   ELSE 'a ' || t END;
        END IF;
    END IF;
    IF s ? 'enum' AND NOT (s -> 'enum') @> jsonb_build_array(v) THEN
        RETURN path || ': not one of the allowed values';
    END IF;
    CASE jsonb_typeof(v)
    WHEN 'string' THEN
        IF s ? 'minLength' AND length(v #>> '{}') < (s ->> 'minLength')::int THEN
            RETURN path || ': too short';
        END IF;
        IF s ? 'maxLength' AND length(v #>> '{}') > (s ->> 'maxLength')::int THEN
            RETURN path || ': too long';
        END IF;
        IF s ? 'pattern' AND (v #>> '{}') !~ (s ->> 'pattern') THEN
            RETURN path || ': does not have the required form';
        END IF;
    WHEN 'number' THEN
        n := (v::text)::numeric;
        IF s ? 'minimum' AND n < (s ->> 'minimum')::numeric THEN
            RETURN path || ': too small';
        END IF;
        IF s ? 'maximum' AND n > (s ->> 'maximum')::numeric THEN
            RETURN path || ': too large';
        END IF;
    WHEN 'object' THEN
        FOR k IN SELECT jsonb_array_elements_text(coalesce(s -> 'required', '[]'::jsonb)) LOOP
            IF NOT v ? k THEN
                RETURN path || '.' || k || ': required';
            END IF;
        END LOOP;
        FOR k, sub IN SELECT * FROM jsonb_each(v) LOOP
            IF (s -> 'properties') ? k THEN
                problem := bothy.validate_json(s -> 'properties' -> k, sub, path || '.' || k);
                IF problem IS NOT NULL THEN
                    RETURN problem;
                END IF;
            ELSIF (s -> 'additionalProperties') = 'false'::jsonb THEN
                IF k ~ '^[a-z_]{1,40}$' THEN
                    RETURN path || '.' || k || ': unknown field';
                END IF;
                RETURN path || ': unknown field';
            END IF;
        END LOOP;
    WHEN 'array' THEN
        IF s ? 'minItems' AND jsonb_array_length(v) < (s ->> 'minItems')::int THEN
            RETURN path || ': too few items';
        END IF;
        IF s ? 'maxItems' AND jsonb_array_length(v) > (s ->> 'maxItems')::int THEN
            RETURN path || ': too many items';
        END IF;
        IF s ? 'items' THEN
            FOR sub IN SELECT jsonb_array_elements(v) LOOP
                problem := bothy.validate_json(s -> 'items', sub, path || '[' || i || ']');
                IF problem IS NOT NULL THEN
                    RETURN problem;
                END IF;
                i := i + 1;
            END LOOP;
        END IF;
    ELSE
        NULL;
    END CASE;
    RETURN NULL;
END
$$;

-- The producer's way in (outbox): call it inside your own transaction.
-- Validates against the type's schema, inserts, and wakes the consumer round
-- at commit. Raises SQLSTATE 22023 with "bothy: ..." for a refused event.
CREATE FUNCTION bothy.append_event(p_type text, p_payload jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s       jsonb;
    problem text;
    new_seq bigint;
BEGIN
    SELECT schema INTO s FROM bothy.event_types WHERE type = p_type;
    IF s IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'bothy: type: unknown event type';
    END IF;
    problem := bothy.validate_json(s, p_payload, 'payload');
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'bothy: ' || problem;
    END IF;
    INSERT INTO bothy.events (type, payload) VALUES (p_type, p_payload) RETURNING seq INTO new_seq;
    PERFORM pg_notify('bothy_events', '');
    RETURN new_seq;
END
$$;
