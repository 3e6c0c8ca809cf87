/**
 * BothyClient: one device's connection to the Bothy Notify gateway.
 *
 * It opens the WebSocket, identifies with a token from `getToken()`, follows
 * the phases (`connecting`, `catching_up`, `live`), pings at the `hello`'s
 * `heartbeat_ms`, renews the token in place (`reauth`) before its `exp`, keeps
 * the focus the app set and sends it again on every new connection, and
 * reconnects after a drop with exponential backoff and full jitter. Close codes
 * (docs/protocol.md, "Close codes"):
 *
 * | code                         | what the client does                                   |
 * |------------------------------|--------------------------------------------------------|
 * | 4001 auth / token expired    | asks `getToken()` again; stops (`auth`) after 3 in a row |
 * | 4010 revoked or deactivated  | stops (`revoked`)                                       |
 * | 4017 replaced                | stops (`replaced`): another connection of this device took over |
 * | 4003 protocol error; 1002, 1007, 1009 (broken framing, text not UTF-8, a message over `sync.max_frame_bytes`) | stops (`protocol`): a bug that reconnecting cannot fix |
 * | 1001, 4008, 4009, 4014, 4029, network errors, anything else | reconnects with backoff |
 *
 * No runtime dependency: in a browser it uses the global `WebSocket`; in Node
 * pass one (`import WebSocket from "ws"`).
 */

import { Backoff, type BackoffOptions } from "./backoff.js";
import {
  CloseCode,
  ID_PATTERN,
  MAX_SEQ,
  type NotificationCreated,
  type NotificationRemoved,
  type Ready,
  type ReadUpdated,
  type UnreadThread,
} from "./frames.js";
import { renewalDelay, tokenExpiry } from "./token.js";

/** The part of the WebSocket API the client uses (the browser's and `ws` both fit). */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  // The events' own types differ between the browser and `ws`; the client reads
  // `data` (a string for a text frame), `code` and `reason`.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onopen: ((event: any) => unknown) | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onmessage: ((event: any) => unknown) | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onclose: ((event: any) => unknown) | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onerror: ((event: any) => unknown) | null;
}

export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** Time as the client sees it (tests pass a fake clock). */
export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  /** Wall-clock milliseconds since the Unix epoch (compared with tokens' `exp`). */
  now(): number;
}

export interface BothyClientOptions {
  /** The gateway, `wss://notify.example.com/v1/gateway`. */
  url: string;
  /** A device token (JWT) of this person and device; called before every connection and reauth. */
  getToken: () => string | Promise<string>;
  /** The WebSocket implementation (default: the global one, as in a browser). */
  WebSocket?: WebSocketConstructor;
  backoff?: BackoffOptions;
  /** Renew the token this long before its `exp`, in ms (60,000; halfway for shorter tokens). */
  reauthMarginMs?: number;
  /** Refusals (4001) in a row after which the client stops with reason `auth` (3). */
  maxAuthFailures?: number;
  /** A connection that has not said `hello` by then is dropped and tried again, in ms (15,000). */
  connectTimeoutMs?: number;
  timers?: Timers;
}

/** Why the client stopped. */
export type StopReason =
  /** `stop()` was called. */
  | "stopped"
  /** The gateway refused `maxAuthFailures` tokens in a row (4001). */
  | "auth"
  /** The device was revoked, or the person deactivated (4010). */
  | "revoked"
  /** A newer connection of the same device took over (4017). */
  | "replaced"
  /** The gateway refused a frame of this client (4003, 1002, 1007, 1009): a bug, not a network problem. */
  | "protocol";

export type ClientState =
  | { state: "connecting"; attempt: number }
  | { state: "catching_up"; userId: string; deviceId: string }
  | { state: "live" }
  | { state: "reconnecting"; attempt: number; delayMs: number; code?: number; reason?: string }
  | { state: "stopped"; reason: StopReason; code?: number };

export interface Focus {
  threadIds: string[];
  idle: boolean;
}

/** What the client reports, by event name. */
export interface BothyClientEvents {
  state: ClientState;
  /** A hint for this person: show (or replace, by thread) an OS notification. */
  notification: NotificationCreated;
  /** A message was deleted: dismiss what the device shows of it, update the badge. */
  removed: NotificationRemoved;
  /** The unread snapshot of a new connection: followed threads with unread messages. */
  unread: UnreadThread[];
  /** A read position moved on another device: dismiss the thread's notifications. */
  read: ReadUpdated;
  /** The gateway applied a focus: the threads it kept (readable ones), in the order sent. */
  focus: Focus;
  /** `identify` was accepted. */
  ready: Ready;
  /** Something went wrong that the client recovers from (getToken threw, a bad frame). */
  error: Error;
}

type Listener<T> = (value: T) => void;

/** The connection ended before the answer came (`markRead`). */
export class ConnectionClosedError extends Error {
  readonly code: number | undefined;
  constructor(code?: number) {
    super(code === undefined ? "the connection ended" : `the connection ended (close code ${code})`);
    this.name = "ConnectionClosedError";
    this.code = code;
  }
}

/** The operation needs a live connection and there is none right now. */
export class NotLiveError extends Error {
  constructor() {
    super("the client is not live; try again once it is (or use the HTTP API)");
    this.name = "NotLiveError";
  }
}

const OPEN = 1;
const CLIENT_CLOSE = 4000;
const NORMAL_CLOSE = 1000;

const globals = globalThis as unknown as {
  WebSocket?: WebSocketConstructor;
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
};

const SYSTEM_TIMERS: Timers = {
  setTimeout: (callback, ms) => globals.setTimeout(callback, ms),
  clearTimeout: (handle) => globals.clearTimeout(handle),
  now: () => Date.now(),
};

interface PendingRead {
  resolve(lastReadSeq: number): void;
  reject(error: Error): void;
}

/** One WebSocket and what belongs to it; a new connection gets a new one. */
class Connection {
  heartbeatMs = 0;
  token: string;
  tokenExp: number | undefined;
  identified = false;
  liveSince: number | undefined;
  awaitingPong = false;
  closed = false;
  pingTimer: unknown;
  reauthTimer: unknown;
  connectTimer: unknown;
  /** `idle` of each focus op sent and not yet acknowledged, oldest first. */
  readonly focusSent: boolean[] = [];
  readonly reads = new Map<string, PendingRead[]>();

  constructor(
    readonly ws: WebSocketLike,
    token: string,
  ) {
    this.token = token;
    this.tokenExp = tokenExpiry(token);
  }
}

export class BothyClient {
  private readonly url: string;
  private readonly getToken: () => string | Promise<string>;
  private readonly WS: WebSocketConstructor;
  private readonly timers: Timers;
  private readonly backoff: Backoff;
  private readonly reauthMarginMs: number;
  private readonly maxAuthFailures: number;
  private readonly connectTimeoutMs: number;
  private readonly listeners = new Map<keyof BothyClientEvents, Set<Listener<never>>>();
  private current: ClientState = { state: "stopped", reason: "stopped" };
  private running = false;
  private generation = 0;
  private conn: Connection | undefined;
  private reconnectTimer: unknown;
  private authFailures = 0;
  private focusState: Focus = { threadIds: [], idle: false };
  private focusSet = false;

  constructor(options: BothyClientOptions) {
    if (typeof options.url !== "string" || !/^wss?:\/\//i.test(options.url)) {
      throw new TypeError("url: must be a ws:// or wss:// URL of the gateway");
    }
    if (typeof options.getToken !== "function") {
      throw new TypeError("getToken: must be a function returning the device token");
    }
    const WS = options.WebSocket ?? globals.WebSocket;
    if (WS === undefined) {
      throw new TypeError("WebSocket: none in this environment; pass one (in Node: the ws package)");
    }
    this.url = options.url;
    this.getToken = options.getToken;
    this.WS = WS;
    this.timers = options.timers ?? SYSTEM_TIMERS;
    this.backoff = new Backoff(options.backoff);
    this.reauthMarginMs = nonNegative("reauthMarginMs", options.reauthMarginMs ?? 60_000);
    this.maxAuthFailures = Math.max(1, Math.floor(options.maxAuthFailures ?? 3));
    this.connectTimeoutMs = nonNegative("connectTimeoutMs", options.connectTimeoutMs ?? 15_000);
  }

  /** The state as last reported by the `state` event. */
  get state(): ClientState {
    return this.current;
  }

  /** The focus the app set last (sent again after every reconnect). */
  get focus(): Focus {
    return { threadIds: [...this.focusState.threadIds], idle: this.focusState.idle };
  }

  /** Listen to an event; returns a function that stops listening. */
  on<K extends keyof BothyClientEvents>(
    event: K,
    listener: Listener<BothyClientEvents[K]>,
  ): () => void {
    let set = this.listeners.get(event);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(event, set);
    }
    set.add(listener as Listener<never>);
    return () => this.off(event, listener);
  }

  off<K extends keyof BothyClientEvents>(event: K, listener: Listener<BothyClientEvents[K]>): void {
    this.listeners.get(event)?.delete(listener as Listener<never>);
  }

  /** Connect, and stay connected until `stop()` or a reason to stop. Calling it again does nothing. */
  start(): void {
    if (this.running) {
      return;
    }
    this.running = true;
    this.authFailures = 0;
    this.backoff.reset();
    void this.connect();
  }

  /** Close the connection (1000) and stop reconnecting. `start()` begins again. */
  stop(): void {
    this.halt({ state: "stopped", reason: "stopped" }, NORMAL_CLOSE);
  }

  /**
   * Tell the gateway which threads the person is looking at, and whether they
   * are idle. Kept, and sent again on every new connection. While a
   * non-idle connection focuses a thread, nobody is told about new messages there.
   *
   * @throws TypeError when an ID is not 1 to 128 characters of `[A-Za-z0-9._:-]`.
   */
  setFocus(threadIds: readonly string[], options: { idle?: boolean } = {}): void {
    if (!Array.isArray(threadIds)) {
      throw new TypeError("threadIds: must be an array of thread IDs");
    }
    threadIds.forEach((id, index) => {
      if (typeof id !== "string" || !ID_PATTERN.test(id)) {
        throw new TypeError(`threadIds[${index}]: not a thread ID (1 to 128 of A-Za-z0-9._:-)`);
      }
    });
    const idle = options.idle ?? false;
    if (typeof idle !== "boolean") {
      throw new TypeError("idle: must be a boolean");
    }
    this.focusState = { threadIds: [...threadIds], idle };
    this.focusSet = true;
    const conn = this.conn;
    if (conn !== undefined && this.current.state === "live") {
      this.sendFocus(conn);
    }
  }

  /**
   * Move the read position of a thread forward (never back). Resolves with the
   * stored position once the gateway has stored it (`read.ack`; it may be higher
   * than `seq`); rejects with {@link ConnectionClosedError} when the connection
   * ends first, and with {@link NotLiveError} when there is no live connection.
   */
  markRead(threadId: string, seq: number): Promise<number> {
    if (typeof threadId !== "string" || !ID_PATTERN.test(threadId)) {
      return Promise.reject(new TypeError("threadId: not a thread ID (1 to 128 of A-Za-z0-9._:-)"));
    }
    if (!Number.isInteger(seq) || seq < 0 || seq > MAX_SEQ) {
      return Promise.reject(new TypeError("seq: must be an integer from 0 to 2^53 - 1"));
    }
    const conn = this.conn;
    if (conn === undefined || this.current.state !== "live") {
      return Promise.reject(new NotLiveError());
    }
    return new Promise<number>((resolve, reject) => {
      let waiting = conn.reads.get(threadId);
      if (waiting === undefined) {
        waiting = [];
        conn.reads.set(threadId, waiting);
      }
      waiting.push({ resolve, reject });
      this.send(conn, { op: "read", d: { thread_id: threadId, seq } });
    });
  }

  // ------------------------------------------------------------------ internals

  private emit<K extends keyof BothyClientEvents>(event: K, value: BothyClientEvents[K]): void {
    const set = this.listeners.get(event);
    if (set === undefined) {
      return;
    }
    for (const listener of [...set]) {
      try {
        (listener as Listener<BothyClientEvents[K]>)(value);
      } catch (error) {
        // A listener's exception must not break the connection's bookkeeping.
        if (event !== "error") {
          this.emit("error", asError(error));
        }
      }
    }
  }

  private setState(state: ClientState): void {
    this.current = state;
    this.emit("state", state);
  }

  private async connect(): Promise<void> {
    const generation = ++this.generation;
    this.setState({ state: "connecting", attempt: this.backoff.attempts });
    let token: string;
    try {
      token = await this.getToken();
      if (typeof token !== "string" || token === "") {
        throw new TypeError("getToken: returned no token");
      }
    } catch (error) {
      if (generation === this.generation && this.running) {
        this.emit("error", asError(error));
        this.scheduleReconnect(undefined, undefined);
      }
      return;
    }
    if (generation !== this.generation || !this.running) {
      return;
    }
    let ws: WebSocketLike;
    try {
      ws = new this.WS(this.url);
    } catch (error) {
      this.emit("error", asError(error));
      this.scheduleReconnect(undefined, undefined);
      return;
    }
    const conn = new Connection(ws, token);
    this.conn = conn;
    ws.onmessage = (event: { data?: unknown }) => this.onMessage(conn, event.data);
    ws.onclose = (event: { code?: unknown; reason?: unknown }) =>
      this.onClose(
        conn,
        typeof event.code === "number" ? event.code : 1006,
        typeof event.reason === "string" ? event.reason : "",
      );
    ws.onerror = () => {
      // A close event follows every error; that is where the client acts.
    };
    if (this.connectTimeoutMs > 0) {
      conn.connectTimer = this.timers.setTimeout(() => {
        if (conn.heartbeatMs === 0) {
          this.drop(conn, "no hello");
        }
      }, this.connectTimeoutMs);
    }
  }

  private onMessage(conn: Connection, data: unknown): void {
    if (conn.closed) {
      return;
    }
    if (typeof data !== "string") {
      this.emit("error", new Error("the gateway sent a frame that is not text"));
      return;
    }
    let frame: { op?: unknown; type?: unknown; d?: unknown };
    try {
      frame = JSON.parse(data) as typeof frame;
    } catch {
      this.emit("error", new Error("the gateway sent a frame that is not JSON"));
      return;
    }
    if (typeof frame !== "object" || frame === null) {
      return;
    }
    if (typeof frame.type === "string") {
      this.onEvent(frame as { type: string });
      return;
    }
    const d = (typeof frame.d === "object" && frame.d !== null ? frame.d : {}) as Record<
      string,
      unknown
    >;
    switch (frame.op) {
      case "hello":
        this.onHello(conn, d);
        break;
      case "ready":
        this.authFailures = 0;
        conn.identified = true;
        this.scheduleReauth(conn);
        this.emit("ready", { user_id: String(d.user_id), device_id: String(d.device_id) });
        this.setState({
          state: "catching_up",
          userId: String(d.user_id),
          deviceId: String(d.device_id),
        });
        break;
      case "unread":
        this.emit("unread", Array.isArray(d.threads) ? (d.threads as UnreadThread[]) : []);
        break;
      case "catchup.complete":
        conn.liveSince = this.timers.now();
        this.setState({ state: "live" });
        if (this.focusSet && this.conn === conn) {
          this.sendFocus(conn);
        }
        break;
      case "focus.ack": {
        const idle = conn.focusSent.shift() ?? false;
        const kept = Array.isArray(d.thread_ids) ? (d.thread_ids as string[]) : [];
        this.emit("focus", { threadIds: kept, idle });
        break;
      }
      case "read.ack": {
        const threadId = String(d.thread_id);
        const waiting = conn.reads.get(threadId);
        const first = waiting?.shift();
        if (waiting !== undefined && waiting.length === 0) {
          conn.reads.delete(threadId);
        }
        first?.resolve(Number(d.last_read_seq));
        break;
      }
      case "pong":
        conn.awaitingPong = false;
        break;
      case "reauth.ack":
        if (typeof d.exp === "number") {
          conn.tokenExp = d.exp;
        }
        this.scheduleReauth(conn);
        break;
      default:
        // An op of a newer gateway: nothing to do.
        break;
    }
  }

  private onEvent(frame: { type: string }): void {
    if (frame.type === "notification.created") {
      this.emit("notification", frame as NotificationCreated);
    } else if (frame.type === "notification.removed") {
      this.emit("removed", frame as NotificationRemoved);
    } else if (frame.type === "read.updated") {
      this.emit("read", frame as ReadUpdated);
    }
  }

  private onHello(conn: Connection, d: Record<string, unknown>): void {
    if (conn.heartbeatMs !== 0) {
      return;
    }
    const heartbeat = typeof d.heartbeat_ms === "number" && d.heartbeat_ms > 0 ? d.heartbeat_ms : 30_000;
    conn.heartbeatMs = heartbeat;
    this.timers.clearTimeout(conn.connectTimer);
    this.send(conn, { op: "identify", d: { token: conn.token } });
    const tick = (): void => {
      if (conn.closed) {
        return;
      }
      if (conn.awaitingPong) {
        // No pong within one interval: the connection is dead or hopelessly slow.
        this.drop(conn, "pong timeout");
        return;
      }
      conn.awaitingPong = true;
      this.send(conn, { op: "ping" });
      conn.pingTimer = this.timers.setTimeout(tick, heartbeat);
    };
    conn.pingTimer = this.timers.setTimeout(tick, heartbeat);
  }

  private sendFocus(conn: Connection): void {
    conn.focusSent.push(this.focusState.idle);
    this.send(conn, {
      op: "focus",
      d: { thread_ids: this.focusState.threadIds, idle: this.focusState.idle },
    });
  }

  private scheduleReauth(conn: Connection): void {
    this.timers.clearTimeout(conn.reauthTimer);
    if (conn.tokenExp === undefined) {
      return;
    }
    const remaining = conn.tokenExp * 1000 - this.timers.now();
    conn.reauthTimer = this.timers.setTimeout(
      () => void this.reauth(conn),
      renewalDelay(remaining, this.reauthMarginMs),
    );
  }

  private async reauth(conn: Connection): Promise<void> {
    let token: string;
    try {
      token = await this.getToken();
    } catch (error) {
      if (!conn.closed) {
        this.emit("error", asError(error));
        this.retryReauth(conn);
      }
      return;
    }
    if (conn.closed || conn !== this.conn) {
      return;
    }
    const exp = tokenExpiry(token);
    if (exp === undefined || (conn.tokenExp !== undefined && exp <= conn.tokenExp)) {
      // getToken() gave no newer token yet: ask again later, while time is left.
      this.retryReauth(conn);
      return;
    }
    conn.token = token;
    this.send(conn, { op: "reauth", d: { token } });
  }

  private retryReauth(conn: Connection): void {
    const remaining = (conn.tokenExp ?? 0) * 1000 - this.timers.now();
    if (remaining > 1000) {
      conn.reauthTimer = this.timers.setTimeout(
        () => void this.reauth(conn),
        Math.max(1000, remaining / 2),
      );
    }
    // Else the gateway closes with 4001 at the expiry and the client connects anew.
  }

  private send(conn: Connection, frame: object): void {
    if (!conn.closed && conn.ws.readyState === OPEN) {
      conn.ws.send(JSON.stringify(frame));
    }
  }

  /** End a connection from this side (dead or silent) and connect again. */
  private drop(conn: Connection, why: string): void {
    if (conn.closed) {
      return;
    }
    this.finish(conn, undefined);
    try {
      conn.ws.close(CLIENT_CLOSE, why);
    } catch {
      // Already closing.
    }
    if (this.running && this.conn === conn) {
      this.scheduleReconnect(undefined, why);
    }
  }

  private onClose(conn: Connection, code: number, reason: string): void {
    if (conn.closed) {
      return;
    }
    this.finish(conn, code);
    if (!this.running || this.conn !== conn) {
      return;
    }
    switch (code) {
      case CloseCode.AUTH:
        this.authFailures += 1;
        if (this.authFailures >= this.maxAuthFailures) {
          this.halt({ state: "stopped", reason: "auth", code }, undefined);
          return;
        }
        break;
      case CloseCode.REVOKED:
        this.halt({ state: "stopped", reason: "revoked", code }, undefined);
        return;
      case CloseCode.REPLACED:
        this.halt({ state: "stopped", reason: "replaced", code }, undefined);
        return;
      case CloseCode.PROTOCOL:
      case CloseCode.FRAMING:
      case CloseCode.INVALID_TEXT:
      case CloseCode.TOO_BIG:
        this.halt({ state: "stopped", reason: "protocol", code }, undefined);
        return;
      default:
        break;
    }
    this.scheduleReconnect(code, reason);
  }

  /** Mark a connection ended: timers off, waiting reads rejected, backoff told how long it lived. */
  private finish(conn: Connection, code: number | undefined): void {
    conn.closed = true;
    conn.ws.onmessage = null;
    conn.ws.onclose = null;
    // Not null: `ws` throws an error event that has no listener (closing while connecting).
    conn.ws.onerror = ignore;
    this.timers.clearTimeout(conn.pingTimer);
    this.timers.clearTimeout(conn.reauthTimer);
    this.timers.clearTimeout(conn.connectTimer);
    for (const waiting of conn.reads.values()) {
      for (const read of waiting) {
        read.reject(new ConnectionClosedError(code));
      }
    }
    conn.reads.clear();
    if (conn.liveSince !== undefined) {
      this.backoff.ended(this.timers.now() - conn.liveSince);
    }
  }

  private scheduleReconnect(code: number | undefined, reason: string | undefined): void {
    const attempt = this.backoff.attempts;
    const delayMs = this.backoff.next();
    const state: ClientState = { state: "reconnecting", attempt, delayMs };
    if (code !== undefined) {
      state.code = code;
    }
    if (reason) {
      state.reason = reason;
    }
    this.conn = undefined;
    this.setState(state);
    this.timers.clearTimeout(this.reconnectTimer);
    this.reconnectTimer = this.timers.setTimeout(() => {
      if (this.running) {
        void this.connect();
      }
    }, delayMs);
  }

  private halt(state: ClientState & { state: "stopped" }, closeCode: number | undefined): void {
    const wasRunning = this.running;
    this.running = false;
    this.generation += 1;
    this.timers.clearTimeout(this.reconnectTimer);
    const conn = this.conn;
    this.conn = undefined;
    if (conn !== undefined && !conn.closed) {
      this.finish(conn, closeCode);
      try {
        conn.ws.close(closeCode ?? NORMAL_CLOSE, "client stopped");
      } catch {
        // Already closing.
      }
    }
    if (wasRunning || this.current.state !== "stopped") {
      this.setState(state);
    }
  }
}

function ignore(): void {
  // Nothing to do.
}

function asError(value: unknown): Error {
  return value instanceof Error ? value : new Error(String(value));
}

function nonNegative(name: string, value: number): number {
  if (!Number.isFinite(value) || value < 0) {
    throw new RangeError(`${name}: must be a number of milliseconds, 0 or more`);
  }
  return value;
}
