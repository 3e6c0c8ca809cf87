-- Envelope data is at most 64 KiB once decoded (docs/topics.md). A length
-- limit on the base64 text alone can only say "87,384 characters", which lets
-- 65,537 and 65,538 bytes through, and PostgreSQL's regular expressions cannot
-- count that far; so the validator learns one keyword, maxDecodedBytes, which
-- the Python validator (bothy_notify/store/events.py) implements too.

-- A small validator for the JSON-schema subset used in schemas/events:
-- type, enum, required, properties, additionalProperties=false, pattern,
-- minLength, maxLength, minimum, maximum, items, minItems, maxItems, and
-- maxDecodedBytes (ours: the most bytes a standard base64 string, whose form
-- its pattern has already checked, decodes to).
-- Returns NULL when "v" is valid, else "<path>: <problem>" (never a value).
CREATE OR REPLACE FUNCTION bothy.validate_json(s jsonb, v jsonb, path text) RETURNS text
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
        -- Canonical base64 (the pattern above): 3 bytes per 4 characters, less one
        -- per trailing '='.
        IF s ? 'maxDecodedBytes'
           AND length(v #>> '{}') / 4 * 3
               - (length(v #>> '{}') - length(rtrim(v #>> '{}', '=')))
               > (s ->> 'maxDecodedBytes')::int THEN
            RETURN path || ': too long';
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
