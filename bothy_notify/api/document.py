"""``GET /v1/openapi.json``: the HTTP API's document, as this server serves it.

``schemas/openapi.yaml`` is the static base (a test keeps its operations equal
to the routes). What only the running configuration knows is filled in here,
so a client generated from the served document, or a fuzzer reading it, sends
only what this server accepts:

- the categories a person can switch (``PUT /v1/preferences``: the built-in
  ones and ``notify.categories``) and let through quiet hours (``PUT
  /v1/quiet-hours``' ``breakthrough``), and the time zones a person may choose
  (``tzdata``'s names); the app categories a ``hint.requested``
  may name (``notify.categories``; without any, no ``hint.requested`` is
  accepted and its branch of ``Event`` is left out);
- the providers of ``POST /v1/registrations`` and the channels of ``POST
  /v1/recipients/register``: both request bodies are a ``oneOf`` with one
  branch per provider (the branch's ``provider`` or ``channel`` is a
  ``const``), and the branches of providers this server has not configured
  are left out;
- the apps a registration's ``app_id`` may name, for a provider whose block
  configures ``apps`` (then ``app_id`` is required and one of them; such a
  provider is no topic-mode channel, and ``GET /v1/webpush/key`` needs one of
  Web Push's);
- the push service hosts a Web Push subscription's ``endpoint`` may name
  (``push.webpush.allowed_endpoints``, spelled in its ``pattern``; apps whose
  hosts differ get a branch each);
- ``server.max_batch_events`` as the batch's ``maxItems``;
- the Matrix push gateway's path only when ``[matrix_gateway]`` is configured,
  with ``matrix_gateway.max_devices`` as its devices' ``maxItems``.

The event payload schemas the base refers to as files (``events/*.json``) are
inlined as ``#/components/schemas/payload.<type>``, so the document stands
alone, and their ``maxDecodedBytes`` (this project's keyword, which other
readers ignore) is spelled as a ``maxLength`` every JSON Schema reader knows.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response

from bothy_notify import resources
from bothy_notify.api.context import ApiContext
from bothy_notify.api.preferences import known_categories
from bothy_notify.config import WebPushConfig, provider_apps
from bothy_notify.notify.domain.quiet import ZONES

EVENT_FILE_PREFIX = "events/"
PAYLOAD_PREFIX = "payload."
"""Component name prefix of an inlined event payload schema (``payload.thread.read``)."""
_SCHEMAS = "#/components/schemas/"

AppsByProvider = tuple[tuple[str, tuple[str, ...]], ...]
"""``((provider, (app_id, ...)), ...)``: hashable, so a document is built once per value."""
HostsByApp = tuple[tuple[str | None, tuple[str, ...]], ...]
"""``((app_id, (host, ...)), ...)``; app ``None`` is a block without apps."""
WEBPUSH = "webpush"
MATRIX_NOTIFY = "/_matrix/push/v1/notify"


@dataclass(frozen=True, slots=True)
class Enumerations:
    """What the served document takes from the running configuration.

    Attributes:
        categories: every category a person can switch, built-in ones first.
        app_categories: ``notify.categories``, the categories of app hints.
        providers: the configured providers (those without apps and with a
            topic-mode form are also the topic-mode channels).
        apps: per provider that configures apps, the app ids (sorted); a
            provider not named here takes any ``app_id`` of the ID form.
        max_batch_events: ``server.max_batch_events``.
        webpush_hosts: per Web Push app, the hosts of its ``allowed_endpoints``
            (empty: the base's form of any https URL is kept).
        matrix_devices: ``matrix_gateway.max_devices``; ``None``: the gateway is not
            configured and its path is left out.
    """

    categories: tuple[str, ...]
    app_categories: tuple[str, ...]
    providers: frozenset[str]
    apps: AppsByProvider = ()
    max_batch_events: int = 1000
    webpush_hosts: HostsByApp = ()
    matrix_devices: int | None = None


def enumerations(ctx: ApiContext) -> Enumerations:
    """The enumerations of this server's configuration."""
    return Enumerations(
        categories=known_categories(ctx),
        app_categories=tuple(ctx.config.notify.categories),
        providers=ctx.provider_names,
        apps=tuple(
            (name, tuple(sorted(ids))) for name, ids in sorted(ctx.provider_apps.items()) if ids
        ),
        max_batch_events=ctx.config.server.max_batch_events,
        webpush_hosts=webpush_hosts(ctx.config.push.webpush),
        matrix_devices=ctx.matrix.config.max_devices if ctx.matrix is not None else None,
    )


def webpush_hosts(block: WebPushConfig | None) -> HostsByApp:
    """The ``allowed_endpoints`` of each app of ``[push.webpush]`` (as configured)."""
    if block is None:
        return ()
    return tuple(
        (app.app_id, tuple(app.settings.allowed_endpoints)) for app in provider_apps(WEBPUSH, block)
    )


async def get_openapi(ctx: ApiContext, request: Request) -> Response:
    """The served document (no token: it describes the API, it holds no data)."""
    return Response(
        encoded_document(enumerations(ctx)),
        media_type="application/json",
        headers={"Cache-Control": "no-cache"},
    )


@functools.lru_cache(maxsize=8)
def encoded_document(enums: Enumerations) -> bytes:
    """:func:`served_document` as JSON, built once per configuration."""
    return json.dumps(served_document(enums), separators=(",", ":")).encode()


@functools.cache
def base_document() -> dict[str, Any]:
    """``schemas/openapi.yaml`` as read from the package data (do not modify)."""
    loaded: dict[str, Any] = yaml.safe_load(
        (resources.schemas() / "openapi.yaml").read_text(encoding="utf-8")
    )
    return loaded


def served_document(enums: Enumerations) -> dict[str, Any]:
    """The base document with the event schemas inlined and ``enums`` filled in."""
    document = copy.deepcopy(base_document())
    schemas: dict[str, Any] = document["components"]["schemas"]
    document["components"]["schemas"] = _with_payload_schemas(document, schemas)
    schemas = document["components"]["schemas"]
    document["servers"] = [{"url": "/", "description": "this server"}]

    categories = schemas["Preferences"]["properties"]["categories"]
    categories["propertyNames"] = {"enum": list(enums.categories)}
    schemas["Breakthrough"]["items"] = {"type": "string", "enum": list(enums.categories)}
    schemas["TimeZone"]["enum"] = sorted(ZONES)

    hint = schemas.get(f"{PAYLOAD_PREFIX}hint.requested")
    if hint is not None and enums.app_categories:
        hint["properties"]["category"]["enum"] = list(enums.app_categories)
    elif hint is not None:
        _drop_branches(schemas, "Event", lambda branch: _const(branch, "type") == "hint.requested")

    apps = dict(enums.apps)
    channels = enums.providers - set(apps)  # a block with apps serves no recipients
    for name, field, names in (
        ("RegistrationRequest", "provider", enums.providers),
        ("RecipientRegistration", "channel", channels),
    ):
        _drop_branches(schemas, name, partial(_not_configured, field, names))
    for branch in schemas["RegistrationRequest"].get("oneOf", []):
        target = _resolve(schemas, branch)
        app_ids = apps.get(str(_const(target, "provider")))
        if app_ids:
            _require_app(target, app_ids)
    if WEBPUSH in enums.providers and enums.webpush_hosts:
        _spell_webpush_hosts(schemas, enums.webpush_hosts)
    key_parameters = document["paths"]["/v1/webpush/key"]["get"]["parameters"]
    if apps.get(WEBPUSH):
        (app_id,) = (p for p in key_parameters if p["name"] == "app_id")
        app_id.update(required=True, schema={"enum": list(apps[WEBPUSH])})

    events = schemas["EventBatch"]["properties"]["events"]
    events["maxItems"] = enums.max_batch_events
    if enums.matrix_devices is None:
        del document["paths"][MATRIX_NOTIFY]
    else:
        notification = schemas["MatrixNotifyRequest"]["properties"]["notification"]
        notification["properties"]["devices"]["maxItems"] = enums.matrix_devices
    return document


def _require_app(branch: dict[str, Any], app_ids: Iterable[str]) -> None:
    branch["properties"]["app_id"] = {"enum": list(app_ids)}
    branch["required"] = [*(r for r in branch["required"] if r != "app_id"), "app_id"]


def _spell_webpush_hosts(schemas: dict[str, Any], hosts: HostsByApp) -> None:
    """Spell the allowed push service hosts in the subscription's ``endpoint``: in
    ``PushSubscription`` itself when every app allows the same ones, else one branch
    of ``RegistrationRequest`` per set of hosts, naming its apps."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for app_id, allowed in hosts:
        groups.setdefault(allowed, []).extend([app_id] if app_id is not None else [])
    if len(groups) == 1:
        (allowed,) = groups
        if allowed:
            _spell_endpoint(schemas["PushSubscription"], allowed)
        else:  # no endpoint can be registered
            _drop_branches(schemas, "RegistrationRequest", _is_webpush)
        return
    request = schemas["RegistrationRequest"]
    branches = [b for b in request.get("oneOf", []) if not _is_webpush(_resolve(schemas, b))]
    for allowed, app_ids in groups.items():
        if allowed:
            branch = copy.deepcopy(schemas["WebPushRegistrationRequest"])
            subscription = copy.deepcopy(schemas["PushSubscription"])
            _spell_endpoint(subscription, allowed)
            branch["properties"]["subscription"] = subscription
            _require_app(branch, app_ids)
            branches.append(branch)
    request["oneOf"] = branches


def _is_webpush(branch: Any) -> bool:
    return _const(branch, "provider") == WEBPUSH


def _spell_endpoint(subscription: dict[str, Any], allowed: Iterable[str]) -> None:
    """The ``endpoint`` pattern of exactly the hosts ``host_allowed`` accepts for
    ``allowed`` (exact names and ``*.suffix``, any case, trailing dots; IP literals),
    with the base's port and path."""
    endpoint = subscription["properties"]["endpoint"]
    alternatives = []
    for entry in allowed:
        name = entry.lower().rstrip(".")
        if ":" in name:  # an IPv6 literal, bracketed in a URL
            alternatives.append(rf"\[{_caseless(name)}\]")
        elif name.startswith("*."):  # at least one label: no dot first or last
            head = "[A-Za-z0-9-](?:[A-Za-z0-9.-]*[A-Za-z0-9-])?"
            alternatives.append(rf"{head}[.]{_caseless(name[2:])}[.]*")
        else:
            alternatives.append(rf"{_caseless(name)}[.]*")
    base = endpoint["pattern"]
    rest = base[base.index("(:") :]  # the port and the path, as the base gives them
    endpoint["pattern"] = f"^https://({'|'.join(alternatives)}){rest}"


def _caseless(name: str) -> str:
    return "".join(
        f"[{c}{c.upper()}]" if c.isalpha() else ("[.]" if c == "." else re.escape(c)) for c in name
    )


def _with_payload_schemas(document: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """Point every ``events/<type>.json`` reference at an inlined component."""
    payloads: dict[str, Any] = {}
    for name, schema in resources.event_schemas().items():
        inlined = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}
        payloads[f"{PAYLOAD_PREFIX}{name}"] = _spell_decoded_bounds(inlined)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(EVENT_FILE_PREFIX):
                event_type = ref.removeprefix(EVENT_FILE_PREFIX).removesuffix(".json")
                node["$ref"] = f"{_SCHEMAS}{PAYLOAD_PREFIX}{event_type}"
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return {**schemas, **payloads}


def _spell_decoded_bounds(node: Any) -> Any:
    """``maxDecodedBytes: N`` on a canonical base64 string, as a ``maxLength``.

    Canonical base64 of N = 3k + r bytes: every string of up to 4k characters
    decodes to at most 3k bytes; of 4k + 4 characters only those whose padding
    leaves at most N bytes (``==``: one byte, ``=``: two) when r is not zero.
    That last form cannot be said in lengths without an ``anyOf`` that costs a
    generator minutes per string, so the served bound is ``maxLength: 4k`` and
    the description names the one form the server also accepts. The document
    never allows more than the server does.
    """
    if isinstance(node, list):
        return [_spell_decoded_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _spell_decoded_bounds(value) for key, value in node.items()}
    limit = out.pop("maxDecodedBytes", None)
    if isinstance(limit, int):
        groups, rest = divmod(limit, 3)
        out["maxLength"] = 4 * groups
        if rest:
            padding = "==" if rest == 1 else "= or =="
            out["description"] = (
                f"{out.get('description', '')} At most {limit} bytes once decoded: up to"
                f" {4 * groups} characters, or exactly {4 * groups + 4} ending in {padding}."
            ).strip()
    return out


def _resolve(schemas: Mapping[str, Any], node: Any) -> Any:
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str) and ref.startswith(_SCHEMAS):
        return schemas[ref.removeprefix(_SCHEMAS)]
    return node


def _const(schema: Any, field: str) -> object:
    """The ``const`` of ``field`` in an object schema (``None`` when it has none)."""
    if not isinstance(schema, dict):
        return None
    prop = schema.get("properties", {}).get(field)
    return prop.get("const") if isinstance(prop, dict) else None


def _not_configured(field: str, providers: frozenset[str], branch: Any) -> bool:
    return _const(branch, field) not in providers


def _drop_branches(schemas: dict[str, Any], name: str, drop: Callable[[Any], bool]) -> None:
    """Leave out the branches of ``schemas[name]``'s ``oneOf`` that ``drop`` names
    (it gets each branch resolved); with none left, the schema accepts nothing."""
    schema = schemas[name]
    kept = [branch for branch in schema.get("oneOf", []) if not drop(_resolve(schemas, branch))]
    if kept:
        schema["oneOf"] = kept
    else:
        schema.pop("oneOf", None)
        schema["not"] = {}
