-- A number whose fractional part is zero is an integer (JSON Schema says so, and
-- bothy.validate_json already accepts 8487.0 where an integer is asked for), but
-- jsonb keeps the text's scale: '{"seq": 8487.0}' was stored as 8487.0, so a
-- reader got a float where the schema promised an integer. The HTTP API reads
-- such numbers as integers before they reach the database
-- (bothy_notify/kernel/strict_json.py); this does the same for producers that
-- call bothy.append_event themselves (the outbox path): what is stored is the
-- integer, 8487.

-- "v" with every value its schema "s" types as an integer written without a
-- fraction (8487.0 -> 8487). Only called on a payload that validate_json
-- accepted, so every such value is integral. Follows properties and items, as
-- validate_json does.
CREATE FUNCTION bothy.integral_json(s jsonb, v jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    out jsonb;
BEGIN
    IF s IS NULL THEN
        RETURN v;
    END IF;
    CASE jsonb_typeof(v)
    WHEN 'number' THEN
        IF s ->> 'type' = 'integer' THEN
            RETURN to_jsonb(trunc((v::text)::numeric));
        END IF;
        RETURN v;
    WHEN 'object' THEN
        IF NOT s ? 'properties' THEN
            RETURN v;
        END IF;
        SELECT coalesce(jsonb_object_agg(key, bothy.integral_json(s -> 'properties' -> key, value)),
                        '{}'::jsonb)
          INTO out FROM jsonb_each(v);
        RETURN out;
    WHEN 'array' THEN
        IF NOT s ? 'items' THEN
            RETURN v;
        END IF;
        SELECT coalesce(jsonb_agg(bothy.integral_json(s -> 'items', value) ORDER BY n), '[]'::jsonb)
          INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, n);
        RETURN out;
    ELSE
        RETURN v;
    END CASE;
END
$$;

-- As in 0001, and the stored payload has its integers without a fraction. jsonb
-- writes a number with a fraction (any scale above zero) with a '.', and never
-- with an exponent, so a payload whose text has no '.' has nothing to rewrite.
CREATE OR REPLACE FUNCTION bothy.append_event(p_type text, p_payload jsonb) RETURNS bigint
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
    IF strpos(p_payload::text, '.') > 0 THEN
        p_payload := bothy.integral_json(s, p_payload);
    END IF;
    INSERT INTO bothy.events (type, payload) VALUES (p_type, p_payload) RETURNING seq INTO new_seq;
    PERFORM pg_notify('bothy_events', '');
    RETURN new_seq;
END
$$;
