/**
 * The client's rules on a fake clock and a fake socket (no network, no daemon):
 * backoff timing, the close-code policy, heartbeats, focus, markRead, reauth,
 * and the idle helper.
 */

import assert from "node:assert/strict";
import { beforeEach, describe, it } from "node:test";

import {
  Backoff,
  BothyClient,
  ConnectionClosedError,
  NotLiveError,
  tokenExpiry,
  watchIdle,
  type BothyClientOptions,
  type ClientState,
  type DocumentLike,
  type EventSourceLike,
} from "@bothy/notify-client";

import { FakeSocket, FakeTimers, settle, tokenExpiring } from "./support/fakes.js";

const URL = "ws://gateway.test/v1/gateway";

interface Rig {
  client: BothyClient;
  timers: FakeTimers;
  states: ClientState[];
  tokens: string[];
}

function rig(options: Partial<BothyClientOptions> & { token?: () => string } = {}): Rig {
  const timers = new FakeTimers();
  const tokens: string[] = [];
  const next = options.token ?? (() => tokenExpiring(Math.floor(timers.now() / 1000) + 3600, `t${tokens.length}`));
  const client = new BothyClient({
    url: URL,
    getToken: () => {
      const token = next();
      tokens.push(token);
      return token;
    },
    WebSocket: FakeSocket,
    timers,
    backoff: { random: () => 0.9999 },
    ...options,
  });
  const states: ClientState[] = [];
  client.on("state", (s) => states.push(s));
  return { client, timers, states, tokens };
}

async function live(r: Rig, heartbeatMs = 30_000): Promise<FakeSocket> {
  r.client.start();
  await settle();
  const socket = FakeSocket.last();
  socket.handshake({ heartbeatMs });
  assert.equal(r.client.state.state, "live");
  return socket;
}

beforeEach(() => FakeSocket.reset());

/** The state's name, read afresh (no narrowing carried over from an earlier check). */
function stateOf(client: BothyClient): string {
  return client.state.state;
}

describe("backoff on a fake clock", () => {
  it("waits a random share of 500 ms, doubling up to 30 s, and reconnects exactly then", async () => {
    const r = rig();
    r.client.start();
    await settle();
    const ceilings = [500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000];
    for (const [attempt, ceiling] of ceilings.entries()) {
      assert.equal(FakeSocket.sockets.length, attempt + 1);
      FakeSocket.last().serverClose(1006);
      const state = r.client.state;
      assert.equal(state.state, "reconnecting");
      assert.ok(state.state === "reconnecting");
      assert.equal(state.attempt, attempt);
      assert.equal(state.delayMs, Math.floor(0.9999 * ceiling));
      assert.equal(state.code, 1006);
      // Not a millisecond early...
      await r.timers.advance(state.delayMs - 1);
      assert.equal(FakeSocket.sockets.length, attempt + 1);
      // ...and at once when due.
      await r.timers.advance(1);
      assert.equal(FakeSocket.sockets.length, attempt + 2);
      assert.equal(r.client.state.state, "connecting");
    }
    r.client.stop();
  });

  it("is full jitter: the delay is the random share of the ceiling", () => {
    const draws = [0, 0.5, 0.25];
    const backoff = new Backoff({ random: () => draws.shift() ?? 0 });
    assert.deepEqual([backoff.next(), backoff.next(), backoff.next()], [0, 500, 500]);
  });

  it("starts from 500 ms again after a connection that stayed live for 60 s", async () => {
    const r = rig();
    r.client.start();
    await settle();
    for (let i = 0; i < 4; i++) {
      FakeSocket.last().serverClose(1006);
      await r.timers.advance(r.timers.untilNext());
    }
    const socket = FakeSocket.last();
    socket.handshake();
    await r.timers.advance(59_999);
    socket.serverClose(1001, "server shutting down");
    let state = r.client.state;
    assert.ok(state.state === "reconnecting");
    assert.equal(state.delayMs, Math.floor(0.9999 * 8000), "59.999 s live is not enough");

    await r.timers.advance(state.delayMs);
    const next = FakeSocket.last();
    next.handshake();
    await r.timers.advance(60_000);
    next.serverClose(1001, "server shutting down");
    state = r.client.state;
    assert.ok(state.state === "reconnecting");
    assert.equal(state.attempt, 0);
    assert.equal(state.delayMs, Math.floor(0.9999 * 500));
    r.client.stop();
  });

  it("refuses settings that make no sense, naming them", () => {
    assert.throws(() => new Backoff({ initialMs: 0 }), /backoff.initialMs/);
    assert.throws(() => new Backoff({ initialMs: 1000, maxMs: 10 }), /backoff.maxMs/);
  });
});

describe("close codes", () => {
  for (const [code, reason] of [
    [4010, "revoked"],
    [4017, "replaced"],
    [4003, "protocol"],
    [1002, "protocol"],
    [1007, "protocol"],
    [1009, "protocol"],
  ] as const) {
    it(`${code} stops with reason ${reason} and never reconnects`, async () => {
      const r = rig();
      const socket = await live(r);
      socket.serverClose(code);
      assert.deepEqual(r.client.state, { state: "stopped", reason, code });
      await r.timers.advance(120_000);
      assert.equal(FakeSocket.sockets.length, 1);
      assert.equal(r.timers.pending, 0, "no timer is left behind");
    });
  }

  for (const code of [1001, 1006, 1011, 4008, 4009, 4014, 4029]) {
    it(`${code} reconnects with backoff`, async () => {
      const r = rig();
      const socket = await live(r);
      socket.serverClose(code);
      const state = r.client.state;
      assert.ok(state.state === "reconnecting");
      assert.equal(state.code, code);
      await r.timers.advance(state.delayMs);
      assert.equal(FakeSocket.sockets.length, 2);
      FakeSocket.last().handshake();
      assert.equal(r.client.state.state, "live");
      r.client.stop();
    });
  }

  it("4001 asks getToken() again each time and stops with reason auth after 3 in a row", async () => {
    const r = rig();
    r.client.start();
    for (let i = 0; i < 3; i++) {
      await settle();
      const socket = FakeSocket.last();
      socket.deliver({ op: "hello", d: { heartbeat_ms: 30_000 } });
      assert.deepEqual(socket.ops("identify")[0], { op: "identify", d: { token: r.tokens[i] } });
      socket.serverClose(4001, "authentication failed");
      if (i < 2) {
        assert.equal(r.client.state.state, "reconnecting");
        await r.timers.advance(r.timers.untilNext());
      }
    }
    assert.deepEqual(r.client.state, { state: "stopped", reason: "auth", code: 4001 });
    assert.equal(r.tokens.length, 3, "a fresh token for every attempt");
  });

  it("an accepted identify resets the count of refusals", async () => {
    const r = rig();
    r.client.start();
    for (const accept of [false, false, true, false, false]) {
      await settle();
      const socket = FakeSocket.last();
      if (accept) {
        socket.handshake();
        socket.serverClose(1001);
      } else {
        socket.deliver({ op: "hello", d: { heartbeat_ms: 30_000 } });
        socket.serverClose(4001);
      }
      await r.timers.advance(r.timers.untilNext());
    }
    assert.notEqual(r.client.state.state, "stopped");
    r.client.stop();
  });

  it("stop() closes with 1000, reports stopped and leaves no timer", async () => {
    const r = rig();
    const socket = await live(r, 1000);
    r.client.stop();
    assert.deepEqual(socket.closedWith, { code: 1000, reason: "client stopped" });
    assert.deepEqual(r.client.state, { state: "stopped", reason: "stopped" });
    assert.equal(r.timers.pending, 0);
  });

  it("a getToken() that throws is reported and tried again with backoff", async () => {
    let calls = 0;
    const timers = new FakeTimers();
    const client = new BothyClient({
      url: URL,
      WebSocket: FakeSocket,
      timers,
      backoff: { random: () => 0.5 },
      getToken: () => {
        calls += 1;
        if (calls === 1) {
          throw new Error("the app's session is not ready");
        }
        return tokenExpiring(Math.floor(timers.now() / 1000) + 3600);
      },
    });
    const errors: Error[] = [];
    client.on("error", (e) => errors.push(e));
    client.start();
    await settle();
    assert.equal(errors[0]?.message, "the app's session is not ready");
    assert.equal(FakeSocket.sockets.length, 0);
    await timers.advance(250);
    assert.equal(FakeSocket.sockets.length, 1);
    client.stop();
  });
});

describe("heartbeat", () => {
  it("pings every heartbeat_ms and drops the socket when a pong is missing for one interval", async () => {
    const r = rig();
    r.client.start();
    await settle();
    const socket = FakeSocket.last();
    socket.autoPong = false;
    socket.handshake({ heartbeatMs: 1000 });
    await r.timers.advance(1000);
    assert.equal(socket.ops("ping").length, 1);
    socket.deliver({ op: "pong" });
    await r.timers.advance(1000);
    assert.equal(socket.ops("ping").length, 2);
    assert.equal(stateOf(r.client), "live", "answered pings keep the connection");
    // No pong for the second ping: one interval later the socket is dropped.
    await r.timers.advance(999);
    assert.equal(stateOf(r.client), "live");
    await r.timers.advance(1);
    assert.equal(socket.closedWith?.code, 4000);
    const state: ClientState = r.client.state;
    assert.ok(state.state === "reconnecting");
    assert.equal(state.reason, "pong timeout");
    await r.timers.advance(state.delayMs);
    assert.equal(FakeSocket.sockets.length, 2, "connects again");
    r.client.stop();
  });

  it("a socket that never says hello is dropped after connectTimeoutMs", async () => {
    const r = rig({ connectTimeoutMs: 5000 });
    r.client.start();
    await settle();
    await r.timers.advance(5000);
    assert.equal(FakeSocket.last().closedWith?.code, 4000);
    assert.equal(r.client.state.state, "reconnecting");
    r.client.stop();
  });
});

describe("focus", () => {
  it("is sent once live, and again after every reconnect", async () => {
    const r = rig();
    const focus: { threadIds: string[]; idle: boolean }[] = [];
    r.client.on("focus", (f) => focus.push(f));
    r.client.setFocus(["t1", "t2"], { idle: false });
    const first = await live(r);
    assert.deepEqual(first.ops("focus"), [{ op: "focus", d: { thread_ids: ["t1", "t2"], idle: false } }]);
    first.deliver({ op: "focus.ack", d: { thread_ids: ["t1"] } });
    assert.deepEqual(focus, [{ threadIds: ["t1"], idle: false }]);

    r.client.setFocus(["t3"], { idle: true });
    assert.deepEqual(first.ops("focus").at(-1), { op: "focus", d: { thread_ids: ["t3"], idle: true } });

    first.serverClose(1001);
    await r.timers.advance(r.timers.untilNext());
    const second = FakeSocket.last();
    second.deliver({ op: "hello", d: { heartbeat_ms: 30_000 } });
    second.deliver({ op: "ready", d: { user_id: "alex", device_id: "alex-desktop" } });
    assert.deepEqual(second.ops("focus"), [], "not before the connection is live");
    second.deliver({ op: "catchup.complete" });
    assert.deepEqual(second.ops("focus"), [{ op: "focus", d: { thread_ids: ["t3"], idle: true } }]);
    r.client.stop();
  });

  it("no focus is sent until the app sets one", async () => {
    const r = rig();
    const socket = await live(r);
    assert.deepEqual(socket.ops("focus"), []);
    r.client.stop();
  });

  it("refuses an ID the gateway would refuse, naming it", () => {
    const r = rig();
    assert.throws(() => r.client.setFocus(["ok", "not ok"]), /threadIds\[1\]/);
    assert.throws(() => r.client.setFocus(["x".repeat(129)]), /threadIds\[0\]/);
  });
});

describe("markRead", () => {
  it("resolves with the stored position on read.ack", async () => {
    const r = rig();
    const socket = await live(r);
    const answer = r.client.markRead("t1", 5);
    assert.deepEqual(socket.ops("read"), [{ op: "read", d: { thread_id: "t1", seq: 5 } }]);
    socket.deliver({ op: "read.ack", d: { thread_id: "t1", last_read_seq: 7 } });
    assert.equal(await answer, 7);
    r.client.stop();
  });

  it("rejects with ConnectionClosedError when the connection ends first", async () => {
    const r = rig();
    const socket = await live(r);
    const answer = r.client.markRead("t1", 5);
    socket.serverClose(4009, "heartbeat timeout");
    await assert.rejects(answer, (e: unknown) => e instanceof ConnectionClosedError && e.code === 4009);
    r.client.stop();
  });

  it("rejects with NotLiveError without a live connection, and bad arguments by name", async () => {
    const r = rig();
    await assert.rejects(r.client.markRead("t1", 1), NotLiveError);
    await live(r);
    await assert.rejects(r.client.markRead("t 1", 1), /threadId/);
    await assert.rejects(r.client.markRead("t1", -1), /seq/);
    await assert.rejects(r.client.markRead("t1", 2 ** 53), /seq/);
    r.client.stop();
  });
});

describe("events", () => {
  it("reports unread, notification.created, notification.removed and read.updated", async () => {
    const r = rig();
    const seen: unknown[] = [];
    r.client.on("unread", (u) => seen.push(["unread", u]));
    r.client.on("notification", (n) => seen.push(["notification", n.payload.nid]));
    r.client.on("removed", (e) => seen.push(["removed", e.payload, e.scope]));
    r.client.on("read", (e) => seen.push(["read", e.payload]));
    r.client.start();
    await settle();
    const socket = FakeSocket.last();
    socket.handshake({ unread: [{ thread_id: "t1", unread: 2 }] });
    socket.deliver({
      type: "notification.created",
      id: "0194b3a6-7c1e-7d3a-9f00-2a8c1e4b5d6f",
      occurred_at: "2026-01-05T09:00:00.123456Z",
      audience: "alex",
      resource: { kind: "thread", id: "t1" },
      scope: { space_id: "s1", channel_id: "c1", thread_id: "t1" },
      payload: { nid: "n1", kind: "message", thread_id: "t1", message_id: "m1", quiet: false, count: 1 },
    });
    socket.deliver({
      type: "notification.removed",
      id: "0194b3a6-7c1e-7d3a-9f00-2a8c1e4b5d71",
      occurred_at: "2026-01-05T09:00:00.5Z",
      audience: "alex",
      resource: { kind: "thread", id: "t1" },
      scope: { space_id: "s1", channel_id: "c1", thread_id: "t1" },
      payload: { thread_id: "t1", message_id: "m1", badge: 1 },
    });
    socket.deliver({
      type: "read.updated",
      id: "0194b3a6-7c1e-7d3a-9f00-2a8c1e4b5d70",
      occurred_at: "2026-01-05T09:00:01Z",
      audience: "alex",
      resource: { kind: "thread", id: "t1" },
      payload: { thread_id: "t1", seq: 9, badge: 0 },
    });
    socket.deliver({ type: "something.newer", payload: {} });
    socket.deliver({ op: "something.newer" });
    assert.deepEqual(seen, [
      ["unread", [{ thread_id: "t1", unread: 2 }]],
      ["notification", "n1"],
      [
        "removed",
        { thread_id: "t1", message_id: "m1", badge: 1 },
        { space_id: "s1", channel_id: "c1", thread_id: "t1" },
      ],
      ["read", { thread_id: "t1", seq: 9, badge: 0 }],
    ]);
    assert.equal(r.client.state.state, "live", "unknown frames are ignored");
    r.client.stop();
  });

  it("a listener that throws is reported as an error and breaks nothing", async () => {
    const r = rig();
    const errors: Error[] = [];
    r.client.on("error", (e) => errors.push(e));
    r.client.on("unread", () => {
      throw new Error("app bug");
    });
    await live(r);
    assert.equal(errors[0]?.message, "app bug");
    r.client.stop();
  });

  it("the function on() returns stops listening", async () => {
    const r = rig();
    const states: string[] = [];
    const off = r.client.on("state", (s) => states.push(s.state));
    r.client.start();
    await settle();
    off();
    FakeSocket.last().handshake();
    assert.deepEqual(states, ["connecting"]);
    r.client.stop();
  });
});

describe("reauth", () => {
  it("renews the token with a fresh getToken() a minute before exp, and again after reauth.ack", async () => {
    const r = rig({ token: undefined });
    const socket = await live(r);
    const exp = tokenExpiry(r.tokens[0] ?? "");
    assert.equal(exp, Math.floor(r.timers.now() / 1000) + 3600);
    await r.timers.advance(3600_000 - 60_000 - 1);
    assert.equal(socket.ops("reauth").length, 0);
    await r.timers.advance(1);
    assert.equal(r.tokens.length, 2);
    assert.deepEqual(socket.ops("reauth"), [{ op: "reauth", d: { token: r.tokens[1] } }]);
    const next = tokenExpiry(r.tokens[1] ?? "") ?? 0;
    socket.deliver({ op: "reauth.ack", d: { exp: next } });
    await r.timers.advance(next * 1000 - r.timers.now() - 60_000);
    assert.equal(socket.ops("reauth").length, 2);
    assert.equal(FakeSocket.sockets.length, 1, "all on one connection");
    r.client.stop();
  });

  it("renews a short token halfway, and asks again later when getToken() has nothing newer", async () => {
    let exp = 0;
    const timers = new FakeTimers();
    const sent: string[] = [];
    const client = new BothyClient({
      url: URL,
      WebSocket: FakeSocket,
      timers,
      getToken: () => {
        const token = tokenExpiring(exp, String(sent.length));
        sent.push(token);
        return token;
      },
    });
    exp = Math.floor(timers.now() / 1000) + 20;
    client.start();
    await settle();
    const socket = FakeSocket.last();
    socket.handshake();
    await timers.advance(10_000);
    assert.equal(sent.length, 2, "asked halfway through a 20 s token");
    assert.equal(socket.ops("reauth").length, 0, "the same exp is not worth a reauth");
    exp += 20;
    await timers.advance(5_000);
    assert.equal(sent.length, 3);
    assert.deepEqual(socket.ops("reauth"), [{ op: "reauth", d: { token: sent[2] } }]);
    client.stop();
  });
});

describe("the idle helper", () => {
  class Source implements EventSourceLike {
    readonly listeners = new Map<string, Set<() => void>>();
    addEventListener(type: string, listener: () => void): void {
      const set = this.listeners.get(type) ?? new Set();
      set.add(listener);
      this.listeners.set(type, set);
    }
    removeEventListener(type: string, listener: () => void): void {
      this.listeners.get(type)?.delete(listener);
    }
    fire(type: string): void {
      for (const listener of this.listeners.get(type) ?? []) {
        listener();
      }
    }
    count(): number {
      return [...this.listeners.values()].reduce((n, s) => n + s.size, 0);
    }
  }
  class Doc extends Source implements DocumentLike {
    visibilityState = "visible";
  }

  it("reports idle after N minutes without input, and when the page is hidden", async () => {
    const r = rig();
    const socket = await live(r);
    r.client.setFocus(["t1"]);
    const win = new Source();
    const doc = new Doc();
    const stop = watchIdle(r.client, { idleAfterMs: 120_000, window: win, document: doc, timers: r.timers });
    const focusOps = (): unknown[] => socket.ops("focus").map((f) => f.d);
    assert.deepEqual(focusOps(), [{ thread_ids: ["t1"], idle: false }]);

    await r.timers.advance(60_000);
    win.fire("keydown");
    await r.timers.advance(119_999);
    assert.equal(focusOps().length, 1, "input moved the quiet period");
    await r.timers.advance(1);
    assert.deepEqual(focusOps().at(-1), { thread_ids: ["t1"], idle: true });

    win.fire("pointermove");
    assert.deepEqual(focusOps().at(-1), { thread_ids: ["t1"], idle: false });

    doc.visibilityState = "hidden";
    doc.fire("visibilitychange");
    assert.deepEqual(focusOps().at(-1), { thread_ids: ["t1"], idle: true });
    doc.visibilityState = "visible";
    doc.fire("visibilitychange");
    assert.deepEqual(focusOps().at(-1), { thread_ids: ["t1"], idle: false });
    assert.equal(focusOps().length, 5);

    stop();
    assert.equal(win.count() + doc.count(), 0, "every listener removed");
    r.client.stop();
  });
});
