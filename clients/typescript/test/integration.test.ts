/**
 * Against the real daemon: `bothy-notify run` started here with a temporary
 * configuration on the embedded PostgreSQL (port 0; see support/daemon.ts).
 * One daemon serves every test of this file (one of them restarts it in
 * place), and one headless Chromium serves both browser tests: a page that
 * uses the client, and the operator's status page.
 */

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import type { Server } from "node:http";
import { after, before, describe, it } from "node:test";

import type { Page } from "puppeteer-core";

import WebSocket from "ws";

import {
  BothyClient,
  type BothyClientOptions,
  type ClientState,
  type Focus,
  type NotificationCreated,
  type NotificationRemoved,
  type Ready,
  type UnreadThread,
} from "@bothy/notify-client";

import { bundleClient, chromiumMissing, launchChromium, servePage, type Chromium } from "./support/browser.js";
import { Daemon, sign, until } from "./support/daemon.js";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const SLOW = { timeout: 60_000 };

interface Watched {
  client: BothyClient;
  states: ClientState[];
  notifications: NotificationCreated[];
  focus: Focus[];
  unread: UnreadThread[][];
  ready: Ready[];
  tokens: string[];
}

let daemon: Daemon;
const clients: BothyClient[] = [];

before(
  async () => {
    // A 1 s heartbeat so that pings really run; no leeway, so a token ends at its exp.
    daemon = new Daemon({ heartbeat: "1s", leeway: "0s" });
    await daemon.start();
  },
  { timeout: 150_000 },
);

after(async () => {
  for (const c of clients) {
    c.stop();
  }
  await daemon?.stop();
});

function watch(getToken: () => string, options: Partial<BothyClientOptions> = {}): Watched {
  const tokens: string[] = [];
  const client = new BothyClient({
    url: daemon.gatewayUrl,
    WebSocket,
    getToken: () => {
      const token = getToken();
      tokens.push(token);
      return token;
    },
    backoff: { initialMs: 100, maxMs: 400 },
    ...options,
  });
  clients.push(client);
  const w: Watched = { client, states: [], notifications: [], focus: [], unread: [], ready: [], tokens };
  client.on("state", (s) => w.states.push(s));
  client.on("notification", (n) => w.notifications.push(n));
  client.on("focus", (f) => w.focus.push(f));
  client.on("unread", (u) => w.unread.push(u));
  client.on("ready", (r) => w.ready.push(r));
  return w;
}

const names = (w: Watched): string[] => w.states.map((s) => s.state);

describe("against the real daemon", () => {
  it("identifies and receives notification.created", SLOW, async () => {
    await daemon.person("ana", ["t-ana"]);
    const w = watch(() => daemon.deviceToken("ana", "ana-desk"));
    w.client.start();
    await until("live", () => w.client.state.state === "live");
    assert.deepEqual(w.ready, [{ user_id: "ana", device_id: "ana-desk" }]);
    assert.deepEqual(names(w), ["connecting", "catching_up", "live"]);
    assert.deepEqual(w.unread, [[]]);

    await daemon.message("t-ana", "m1", 1);
    await until("notification.created", () => w.notifications.length === 1);
    const n = w.notifications[0];
    assert.ok(n !== undefined);
    assert.equal(n.type, "notification.created");
    assert.match(n.id, UUID);
    assert.ok(!Number.isNaN(Date.parse(n.occurred_at)));
    assert.equal(n.audience, "ana");
    assert.deepEqual(n.resource, { kind: "thread", id: "t-ana" });
    assert.deepEqual(n.scope, { space_id: "s1", channel_id: "c1", thread_id: "t-ana" });
    assert.match(n.payload.nid, UUID);
    assert.equal(n.payload.kind, "message");
    assert.equal(n.payload.thread_id, "t-ana");
    assert.equal(n.payload.message_id, "m1");
    assert.equal(n.payload.quiet, false);
    assert.equal(n.payload.count, 1);
    assert.match(n.payload.mv ?? "", /^[0-9a-f]{16}$/);

    // The read op, answered by read.ack once stored.
    assert.equal(await w.client.markRead("t-ana", 1), 1);
    w.client.stop();
    assert.deepEqual(w.client.state, { state: "stopped", reason: "stopped" });
  });

  it("a deleted message arrives as notification.removed with the new badge", SLOW, async () => {
    await daemon.person("ben", ["t-ben"]);
    const w = watch(() => daemon.deviceToken("ben", "ben-desk"));
    const removed: NotificationRemoved[] = [];
    w.client.on("removed", (e) => removed.push(e));
    w.client.start();
    await until("live", () => w.client.state.state === "live");
    await daemon.message("t-ben", "m1", 1);
    await until("notification.created", () => w.notifications.length === 1);

    await daemon.append([
      {
        type: "message.deleted",
        payload: { thread_id: "t-ben", message_id: "m1", thread_seq: 1, author_id: "author", mentions: [], last_seq: 0 },
      },
    ]);
    await until("notification.removed", () => removed.length === 1);
    const e = removed[0];
    assert.ok(e !== undefined);
    assert.match(e.id, UUID);
    assert.deepEqual(e.resource, { kind: "thread", id: "t-ben" });
    assert.deepEqual(e.scope, { space_id: "s1", channel_id: "c1", thread_id: "t-ben" });
    assert.deepEqual(e.payload, { thread_id: "t-ben", message_id: "m1", badge: 0 });
    w.client.stop();
  });

  it("4001 on an expired token, then success with a fresh one from getToken()", SLOW, async () => {
    await daemon.person("cy", []);
    let calls = 0;
    const w = watch(() => daemon.deviceToken("cy", "cy-desk", { lifetimeS: calls++ === 0 ? -60 : 3600 }));
    w.client.start();
    await until("live", () => w.client.state.state === "live");
    assert.deepEqual(names(w), ["connecting", "reconnecting", "connecting", "catching_up", "live"]);
    const refused = w.states[1];
    assert.ok(refused?.state === "reconnecting");
    assert.equal(refused.code, 4001);
    assert.equal(w.tokens.length, 2);
    w.client.stop();
  });

  it("stops with reason auth after 3 refusals in a row", SLOW, async () => {
    const badlySigned = (): string => {
      const now = Math.floor(Date.now() / 1000);
      const token = sign({ sub: "dee", did: "dee-desk", plat: "linux", kind: "user", exp: now + 3600 });
      return `${token.slice(0, -4)}AAAA`;
    };
    const w = watch(badlySigned);
    w.client.start();
    await until("stopped", () => w.client.state.state === "stopped");
    assert.deepEqual(w.client.state, { state: "stopped", reason: "auth", code: 4001 });
    assert.equal(w.tokens.length, 3);
  });

  it("reauth keeps the connection past the first token's exp", SLOW, async () => {
    await daemon.person("eve", ["t-eve"]);
    const w = watch(() => daemon.deviceToken("eve", "eve-desk", { lifetimeS: 3 }));
    w.client.start();
    await until("live", () => w.client.state.state === "live");
    const firstExp = JSON.parse(Buffer.from(w.tokens[0]?.split(".")[1] ?? "", "base64url").toString()).exp as number;
    // Past the first token's exp (no leeway: the daemon would have closed with 4001).
    await until("past exp", () => Date.now() > firstExp * 1000 + 1500, 10_000);
    assert.deepEqual(names(w), ["connecting", "catching_up", "live"], "one connection throughout");
    assert.ok(w.tokens.length >= 2, "renewed with a fresh getToken()");
    await daemon.message("t-eve", "m1", 1);
    await until("notification.created", () => w.notifications.length === 1);
    w.client.stop();
  });

  it("4017 when the same device connects twice: the older one stops as replaced", SLOW, async () => {
    await daemon.person("fay", []);
    const first = watch(() => daemon.deviceToken("fay", "fay-desk"));
    first.client.start();
    await until("first live", () => first.client.state.state === "live");
    const second = watch(() => daemon.deviceToken("fay", "fay-desk"));
    second.client.start();
    await until("first replaced", () => first.client.state.state === "stopped");
    assert.deepEqual(first.client.state, { state: "stopped", reason: "replaced", code: 4017 });
    await until("second live", () => second.client.state.state === "live");
    second.client.stop();
  });

  it("the focus is restored after the daemon is stopped and started again", { timeout: 120_000 }, async () => {
    await daemon.person("gus", ["t-gus-1", "t-gus-2"]);
    const w = watch(() => daemon.deviceToken("gus", "gus-desk"));
    w.client.setFocus(["t-gus-1", "t-nobody-knows"], { idle: false });
    w.client.start();
    await until("focus applied", () => w.focus.length === 1);
    assert.deepEqual(w.focus[0], { threadIds: ["t-gus-1"], idle: false }, "an unknown thread is dropped");

    await daemon.restart();
    await until("focus applied again", () => w.focus.length === 2, 60_000);
    assert.deepEqual(w.focus[1], { threadIds: ["t-gus-1"], idle: false });
    const seen = names(w);
    assert.ok(seen.includes("reconnecting"), `went through a reconnect: ${seen.join(", ")}`);
    const drained = w.states.find((s) => s.state === "reconnecting");
    assert.ok(drained?.state === "reconnecting");
    assert.equal(drained.code, 1001, "the drain closes with 1001");

    // The restored focus is in effect: a message in the focused thread disturbs
    // nobody (active in the thread), one in the other thread is told.
    const skipped = { reason: "active_in_thread" };
    const before = await daemon.metric("bothy_push_skipped_total", skipped);
    await daemon.message("t-gus-1", "m1", 1);
    await until("skipped as active in the thread", async () => (await daemon.metric("bothy_push_skipped_total", skipped)) > before);
    await daemon.message("t-gus-2", "m2", 1);
    await until("notification.created", () => w.notifications.length === 1);
    assert.equal(w.notifications[0]?.payload.thread_id, "t-gus-2");
    w.client.stop();
  });
});

describe("in headless Chromium", { skip: chromiumMissing() }, () => {
  let chromium: Chromium;
  let pageServer: Server;
  let pageUrl = "";
  let bundle = "";

  before(
    async () => {
      bundle = await bundleClient();
      const served = await servePage(bundle);
      pageServer = served.server;
      pageUrl = served.url;
      chromium = await launchChromium();
    },
    { timeout: 90_000 },
  );

  after(async () => {
    await chromium?.close();
    await new Promise<void>((done) => (pageServer ? pageServer.close(() => done()) : done()));
  });

  async function newPage(): Promise<Page> {
    const page = await chromium.browser.newPage();
    page.setDefaultTimeout(20_000);
    return page;
  }

  it("a page that uses the bundled client receives notification.created from the daemon", SLOW, async () => {
    assert.ok(!bundle.includes("require("), "no runtime dependency in the browser");
    assert.ok(bundle.length < 40_000, `the bundle is small (${bundle.length} bytes)`);
    await daemon.person("hal", ["t-hal"]);
    const page = await newPage();
    try {
      await page.goto(pageUrl);
      await page.evaluate(
        (url: string, token: string) => {
          const w = window as unknown as Record<string, unknown> & { Bothy: typeof import("@bothy/notify-client") };
          const received: unknown[] = [];
          const states: string[] = [];
          const client = new w.Bothy.BothyClient({ url, getToken: () => token });
          client.on("notification", (n) => {
            received.push(n);
            const item = document.createElement("li");
            item.textContent = `${n.payload.kind} in ${n.payload.thread_id ?? "-"}`;
            document.getElementById("hints")?.appendChild(item);
          });
          client.on("state", (s) => states.push(s.state));
          w.Bothy.watchIdle(client, { idleAfterMs: 60_000 });
          client.start();
          Object.assign(w, { received, states, client });
        },
        daemon.gatewayUrl,
        daemon.deviceToken("hal", "hal-browser", { platform: "web" }),
      );
      await page.waitForFunction(() => (window as unknown as { states: string[] }).states.includes("live"));
      await daemon.message("t-hal", "m1", 1);
      await page.waitForFunction(() => (window as unknown as { received: unknown[] }).received.length === 1);
      const [hint] = await page.evaluate(() => (window as unknown as { received: NotificationCreated[] }).received);
      assert.ok(hint !== undefined);
      assert.equal(hint.type, "notification.created");
      assert.equal(hint.audience, "hal");
      assert.deepEqual(hint.resource, { kind: "thread", id: "t-hal" });
      assert.equal(hint.payload.message_id, "m1");
      assert.equal(await page.$eval("#hints li", (li) => li.textContent), "message in t-hal");
      const states = await page.evaluate(() => (window as unknown as { states: string[] }).states);
      assert.deepEqual(states, ["connecting", "catching_up", "live"]);
      await page.evaluate(() => (window as unknown as { client: BothyClient }).client.stop());
    } finally {
      await page.close();
    }
  });

  it("the status page says what a 401 means without a token", SLOW, async () => {
    const page = await newPage();
    try {
      await page.goto(`${daemon.apiUrl}/admin`);
      await page.waitForSelector("#message:not([hidden])");
      const message = await page.$eval("#message", (m) => m.textContent ?? "");
      assert.match(message, /needs an operator token/);
      assert.match(message, /401 unauthorized/);
      assert.equal(await page.$eval("#login", (l) => (l as HTMLElement).hidden), false);
      assert.equal(await page.$eval("#status", (s) => (s as HTMLElement).hidden), true);
    } finally {
      await page.close();
    }
  });

  it("the status page shows a node and live counts that follow events and a desktop", { timeout: 90_000 }, async () => {
    const page = await newPage();
    const text = (selector: string): Promise<string> => page.$eval(selector, (e) => e.textContent ?? "");
    try {
      await page.setViewport({ width: 1280, height: 900 });
      await page.goto(`${daemon.apiUrl}/admin`);
      await page.waitForSelector("#login:not([hidden])");
      const now = Math.floor(Date.now() / 1000);
      await page.type("#token", sign({ sub: "ops", scope: "admin:read admin:write", exp: now + 3600 }));
      await page.click("#token-form button[type=submit]");
      await page.waitForSelector("#status:not([hidden])");
      await page.waitForFunction(() => document.querySelectorAll("#nodes tbody tr").length === 1);
      const node = await text("#nodes tbody tr");
      assert.match(node, /this node/);
      assert.match(node, /all/, "the role");
      assert.match(node, /holds the round/);
      const live = Number(await text("#connections-live"));
      const decided = Number(await text("#events-decided"));

      // A desktop connects: the page's live count follows within a refresh or two.
      await daemon.person("ivy", ["t-ivy"]);
      const desktop = watch(() => daemon.deviceToken("ivy", "ivy-desk"));
      desktop.client.start();
      await until("live", () => desktop.client.state.state === "live");
      await page.waitForFunction(
        (n: number) => document.getElementById("connections-live")?.textContent === String(n),
        {},
        live + 1,
      );
      // Events appended: the events decided follow; a phone's push shows under its provider.
      await daemon.register("ivy", "ivy-phone", "ivy-phone-token");
      await daemon.register("ivy", "ivy-tablet", "transient-ivy-tablet");
      await daemon.message("t-ivy", "m1", 1);
      await page.waitForFunction(
        (n: number) => Number(document.getElementById("events-decided")?.textContent) > n,
        {},
        decided + 1,
      );
      desktop.client.stop();
      await daemon.message("t-ivy", "m2", 2);
      await page.waitForFunction(() => /fake/.test(document.querySelector("#providers tbody")?.textContent ?? ""));
      await page.waitForFunction(
        (n: number) => document.getElementById("connections-live")?.textContent === String(n),
        {},
        live,
      );
      const shot = process.env.BOTHY_STATUS_SCREENSHOT;
      if (shot) {
        // Registrations are counted at most every 10 s; the picture waits for them.
        await page.waitForFunction(() => /fake/.test(document.querySelector("#registrations tbody")?.textContent ?? ""));
        await page.waitForFunction(() => /transient/.test(document.querySelector("#providers tbody")?.textContent ?? ""));
        writeFileSync(shot, await page.screenshot({ fullPage: true }));
      }
    } finally {
      await page.close();
    }
  });
});
