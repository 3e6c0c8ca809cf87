/**
 * The client over real sockets against a small fake gateway (the `ws` package on
 * 127.0.0.1, port 0) that speaks the protocol of docs/protocol.md: `read.updated`
 * reaches the person's other connection (SPEC section 8.5) while `markRead`
 * resolves on `read.ack`, and a 4029 (too many frames) is followed by a
 * reconnect with backoff. (The daemon gains `read.updated` and 4029 in other
 * work; these prove the client's half now.)
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { AddressInfo } from "node:net";

import WebSocket, { WebSocketServer } from "ws";

import { BothyClient, type ClientState, type ReadUpdated } from "@bothy/notify-client";

import { tokenExpiring } from "./support/fakes.js";
import { until } from "./support/daemon.js";

interface Peer {
  socket: WebSocket;
  device: string;
}

describe("against a fake gateway", () => {
  let server: WebSocketServer;
  let url = "";
  const peers: Peer[] = [];
  let positions = new Map<string, number>();
  let closeNextWith: number | undefined;

  before(async () => {
    server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
    await new Promise<void>((done) => server.once("listening", () => done()));
    url = `ws://127.0.0.1:${(server.address() as AddressInfo).port}/v1/gateway`;
    server.on("connection", (socket) => {
      const peer: Peer = { socket, device: "" };
      socket.send(JSON.stringify({ op: "hello", d: { heartbeat_ms: 30_000 } }));
      socket.on("message", (data) => {
        const frame = JSON.parse(String(data)) as { op: string; d?: Record<string, unknown> };
        if (frame.op === "identify") {
          // The fake's tokens carry the device in `tag` (see tokenExpiring).
          const claims = JSON.parse(
            Buffer.from(String(frame.d?.token).split(".")[1] ?? "", "base64url").toString(),
          ) as { tag: string };
          peer.device = claims.tag;
          peers.push(peer);
          socket.send(JSON.stringify({ op: "ready", d: { user_id: "alex", device_id: peer.device } }));
          socket.send(JSON.stringify({ op: "unread", d: { threads: [] } }));
          socket.send(JSON.stringify({ op: "catchup.complete" }));
          if (closeNextWith !== undefined) {
            socket.close(closeNextWith, "too many frames");
            closeNextWith = undefined;
          }
        } else if (frame.op === "read") {
          const thread = String(frame.d?.thread_id);
          const stored = Math.max(positions.get(thread) ?? 0, Number(frame.d?.seq));
          const moved = stored > (positions.get(thread) ?? 0);
          positions.set(thread, stored);
          socket.send(JSON.stringify({ op: "read.ack", d: { thread_id: thread, last_read_seq: stored } }));
          if (moved) {
            const event = {
              type: "read.updated",
              id: "0194b3a6-7c1e-7d3a-9f00-2a8c1e4b5d70",
              occurred_at: new Date().toISOString(),
              audience: "alex",
              resource: { kind: "thread", id: thread },
              payload: { thread_id: thread, seq: stored, badge: 0 },
            };
            for (const other of peers) {
              if (other !== peer && other.socket.readyState === WebSocket.OPEN) {
                other.socket.send(JSON.stringify(event));
              }
            }
          }
        } else if (frame.op === "ping") {
          socket.send(JSON.stringify({ op: "pong" }));
        }
      });
      socket.on("close", () => {
        const index = peers.indexOf(peer);
        if (index >= 0) {
          peers.splice(index, 1);
        }
      });
    });
  });

  after(async () => {
    for (const client of server.clients) {
      client.terminate();
    }
    await new Promise<void>((done) => server.close(() => done()));
  });

  function client(device: string): BothyClient {
    return new BothyClient({
      url,
      WebSocket,
      getToken: () => tokenExpiring(Math.floor(Date.now() / 1000) + 3600, device),
      backoff: { initialMs: 50, maxMs: 200 },
    });
  }

  it("markRead resolves on read.ack; the other desktop gets read.updated, the reader does not", async () => {
    positions = new Map();
    const reader = client("desk-a");
    const other = client("desk-b");
    const seenByOther: ReadUpdated[] = [];
    const seenByReader: ReadUpdated[] = [];
    other.on("read", (e) => seenByOther.push(e));
    reader.on("read", (e) => seenByReader.push(e));
    reader.start();
    other.start();
    try {
      await until("both live", () => reader.state.state === "live" && other.state.state === "live");
      assert.equal(await reader.markRead("t1", 4), 4);
      await until("read.updated", () => seenByOther.length === 1);
      const event = seenByOther[0];
      assert.ok(event !== undefined);
      assert.equal(event.type, "read.updated");
      assert.deepEqual(event.resource, { kind: "thread", id: "t1" });
      assert.deepEqual(event.payload, { thread_id: "t1", seq: 4, badge: 0 });
      // A read that does not move the position forward: acknowledged, nobody told.
      assert.equal(await reader.markRead("t1", 2), 4);
      assert.equal(await other.markRead("t1", 1), 4);
      assert.deepEqual(seenByReader, []);
      assert.equal(seenByOther.length, 1);
    } finally {
      reader.stop();
      other.stop();
    }
  });

  it("4029 (too many frames) is followed by a reconnect with backoff", async () => {
    const desk = client("desk-c");
    const states: ClientState[] = [];
    desk.on("state", (s) => states.push(s));
    closeNextWith = 4029;
    desk.start();
    try {
      await until("live again", () => states.filter((s) => s.state === "live").length === 2);
      const reconnect = states.find((s) => s.state === "reconnecting");
      assert.ok(reconnect !== undefined && reconnect.state === "reconnecting");
      assert.equal(reconnect.code, 4029);
      assert.ok(reconnect.delayMs < 50);
    } finally {
      desk.stop();
    }
  });
});
