/**
 * Fakes for the client's unit tests: a clock whose time moves only when the
 * test says so, and a WebSocket whose server side the test plays.
 */

import type { Timers, WebSocketLike } from "@bothy/notify-client";

interface Scheduled {
  id: number;
  at: number;
  callback: () => void;
}

/** Timers on a fake clock: `advance(ms)` runs what falls due, in order. */
export class FakeTimers implements Timers {
  private time: number;
  private nextId = 1;
  private scheduled: Scheduled[] = [];

  constructor(start = Date.UTC(2026, 0, 5, 9, 0, 0)) {
    this.time = start;
  }

  now(): number {
    return this.time;
  }

  setTimeout(callback: () => void, ms: number): unknown {
    const id = this.nextId++;
    this.scheduled.push({ id, at: this.time + Math.max(0, ms), callback });
    return id;
  }

  clearTimeout(handle: unknown): void {
    this.scheduled = this.scheduled.filter((s) => s.id !== handle);
  }

  /** Milliseconds until the next timer (Infinity when none). */
  untilNext(): number {
    const next = this.earliest();
    return next === undefined ? Infinity : next.at - this.time;
  }

  get pending(): number {
    return this.scheduled.length;
  }

  /** Move the clock forward by `ms`, running every timer that falls due (and the
   * microtasks each one starts) in time order. */
  async advance(ms: number): Promise<void> {
    const end = this.time + ms;
    for (;;) {
      const next = this.earliest();
      if (next === undefined || next.at > end) {
        break;
      }
      this.scheduled = this.scheduled.filter((s) => s !== next);
      this.time = next.at;
      next.callback();
      await settle();
    }
    this.time = end;
    await settle();
  }

  private earliest(): Scheduled | undefined {
    let found: Scheduled | undefined;
    for (const s of this.scheduled) {
      if (found === undefined || s.at < found.at || (s.at === found.at && s.id < found.id)) {
        found = s;
      }
    }
    return found;
  }
}

/** Let pending promise callbacks run (the client awaits `getToken()`). */
export async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await new Promise<void>((done) => setImmediate(done));
  }
}

/** A WebSocket whose server side is the test: `sockets` lists every one created. */
export class FakeSocket implements WebSocketLike {
  static sockets: FakeSocket[] = [];
  readyState = 1;
  readonly url: string;
  /** Answer every ping with a pong at once (a healthy server). */
  autoPong = true;
  readonly sent: Record<string, unknown>[] = [];
  closedWith: { code?: number; reason?: string } | undefined;
  onopen: ((event: unknown) => unknown) | null = null;
  onmessage: ((event: { data: unknown }) => unknown) | null = null;
  onclose: ((event: { code: number; reason: string }) => unknown) | null = null;
  onerror: ((event: unknown) => unknown) | null = null;

  constructor(url: string) {
    this.url = url;
    FakeSocket.sockets.push(this);
  }

  static reset(): void {
    FakeSocket.sockets = [];
  }

  static last(): FakeSocket {
    const socket = FakeSocket.sockets.at(-1);
    if (socket === undefined) {
      throw new Error("no socket was opened");
    }
    return socket;
  }

  send(data: string): void {
    const frame = JSON.parse(data) as Record<string, unknown>;
    this.sent.push(frame);
    if (frame.op === "ping" && this.autoPong) {
      this.deliver({ op: "pong" });
    }
  }

  close(code?: number, reason?: string): void {
    this.closedWith = { ...(code === undefined ? {} : { code }), ...(reason === undefined ? {} : { reason }) };
    this.readyState = 3;
  }

  /** Ops the client sent, by name. */
  ops(op: string): Record<string, unknown>[] {
    return this.sent.filter((f) => f.op === op);
  }

  /** The server sends a frame. */
  deliver(frame: object): void {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }

  /** The server closes the connection. */
  serverClose(code: number, reason = ""): void {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  /** The server side of a successful opening: hello, ready, unread, catchup.complete. */
  handshake(options: { heartbeatMs?: number; unread?: { thread_id: string; unread: number }[] } = {}): void {
    this.deliver({ op: "hello", d: { heartbeat_ms: options.heartbeatMs ?? 30_000 } });
    this.deliver({ op: "ready", d: { user_id: "alex", device_id: "alex-desktop" } });
    this.deliver({ op: "unread", d: { threads: options.unread ?? [] } });
    this.deliver({ op: "catchup.complete" });
  }
}

/** An unsigned JWT with the given `exp` (the client only reads it). */
export function tokenExpiring(expSeconds: number, tag = "t"): string {
  const encode = (value: object): string => Buffer.from(JSON.stringify(value)).toString("base64url");
  return `${encode({ alg: "HS256" })}.${encode({ sub: "alex", exp: expSeconds, tag })}.c2ln`;
}
