/**
 * The gateway's frames (docs/protocol.md, "Gateway (WebSocket)"; SPEC section 8).
 *
 * Client ops and server replies carry `op` and, where they have a body, `d`;
 * server events carry `type`. Absent members are omitted, never `null`.
 */

/** `{"op":"hello","d":{"heartbeat_ms"}}`: the first frame of every connection. */
export interface HelloFrame {
  op: "hello";
  d: { heartbeat_ms: number };
}

/** `{"op":"ready","d":{"user_id","device_id"}}`: `identify` was accepted. */
export interface ReadyFrame {
  op: "ready";
  d: Ready;
}

export interface Ready {
  user_id: string;
  device_id: string;
}

/** One followed, readable thread with unread messages in the `unread` snapshot. */
export interface UnreadThread {
  thread_id: string;
  unread: number;
}

export interface UnreadFrame {
  op: "unread";
  d: { threads: UnreadThread[] };
}

/**
 * `notification.created`: a content-free hint. Render it from the app's own
 * data; `payload.nid` is the same in every push of the same hint, so a device
 * that gets both shows one. Replace hints by thread ID (rarely one is sent twice).
 */
export interface NotificationCreated {
  type: "notification.created";
  /** The envelope's UUIDv7. */
  id: string;
  /** RFC 3339. */
  occurred_at: string;
  /** The person (user id) the hint is for. */
  audience: string;
  /** `thread` for a hint about a thread; `user` (the audience) for one without. */
  resource: { kind: "thread" | "user"; id: string };
  /** The thread's current place; empty for a hint without a thread. */
  scope: { space_id?: string; channel_id?: string; thread_id?: string };
  payload: NotificationPayload;
}

export interface NotificationPayload {
  /** The notification's UUIDv7, the same in the pushes of the same hint. */
  nid: string;
  /** A kind code of the catalogue (`message`, `mention`, `social:friend_request`...). */
  kind: string;
  thread_id?: string;
  message_id?: string;
  /** The device waiting for approval, the grant that expires, the app's target. */
  target_id?: string;
  quiet: boolean;
  /** 1, or the unread count of the hint that ends a coalescing window. */
  count: number;
  /** The kind catalogue's version: fetch `GET /v1/catalogue` again when it differs. */
  mv?: string;
}

/**
 * `read.updated` (SPEC section 8.5): a read position of the person moved forward
 * on another connection (never sent to the connection whose `read` moved it), so
 * a desktop dismisses its OS notifications of the thread.
 */
export interface ReadUpdated {
  type: "read.updated";
  id: string;
  occurred_at: string;
  audience: string;
  resource: { kind: "thread"; id: string };
  scope?: { space_id?: string; channel_id?: string; thread_id?: string };
  payload: {
    thread_id: string;
    /** The stored read position: every message up to it is read. */
    seq: number;
    /** Unread threads of the person after the move. */
    badge: number;
  };
}

/**
 * `notification.removed` (SPEC section 8.5): a message the person may have been
 * told about was deleted, so a desktop dismisses its OS notification of it. The
 * envelope is `notification.created`'s; the payload has no `nid`.
 */
export interface NotificationRemoved {
  type: "notification.removed";
  id: string;
  occurred_at: string;
  audience: string;
  resource: { kind: "thread"; id: string };
  /** The thread's current place. */
  scope: { space_id?: string; channel_id?: string; thread_id?: string };
  payload: {
    thread_id: string;
    /** The deleted message. */
    message_id: string;
    /** Unread threads of the person after the deletion (absent with `push.badge = "off"`). */
    badge?: number;
  };
}

/** Every frame the client reads (others are ignored, so a newer server does no harm). */
export type ServerFrame =
  | HelloFrame
  | ReadyFrame
  | UnreadFrame
  | { op: "catchup.complete" }
  | { op: "focus.ack"; d: { thread_ids: string[] } }
  | { op: "read.ack"; d: { thread_id: string; last_read_seq: number } }
  | { op: "pong" }
  | { op: "reauth.ack"; d: { exp: number } }
  | NotificationCreated
  | NotificationRemoved
  | ReadUpdated;

/** Close codes of the gateway (docs/protocol.md, "Close codes"). */
export const CloseCode = {
  SHUTTING_DOWN: 1001,
  /** RFC 6455's codes for what breaks the WebSocket layer: framing, text not UTF-8, a message too big. */
  FRAMING: 1002,
  INVALID_TEXT: 1007,
  TOO_BIG: 1009,
  AUTH: 4001,
  PROTOCOL: 4003,
  TOO_MANY: 4008,
  HEARTBEAT: 4009,
  REVOKED: 4010,
  WRITES_STALLED: 4014,
  REPLACED: 4017,
  TOO_MANY_FRAMES: 4029,
} as const;

/** An app ID as the gateway accepts it: 1 to 128 characters of `[A-Za-z0-9._:-]`. */
export const ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

/** The largest `seq` of a `read` op: 2^53 - 1. */
export const MAX_SEQ = Number.MAX_SAFE_INTEGER;
