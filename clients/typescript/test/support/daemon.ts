/**
 * The real daemon for the client's tests: `.venv/bin/bothy-notify run` with a
 * temporary configuration on the embedded PostgreSQL (a data directory of its
 * own under the OS's temporary directory), listening on port 0. Its addresses
 * are read from the line it prints once it serves; `restart()` starts it again
 * on the same ports and data (a restart in place).
 *
 * Every wait is bounded. `stop()` ends it with SIGTERM (a graceful drain) and
 * removes the directory; a daemon that outlives its bound is killed, and the
 * embedded PostgreSQL it may leave behind is stopped with `pg_ctl`.
 */

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHmac } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root (this file is clients/typescript/build/test/support/daemon.js). */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../../..");
export const VENV_PYTHON = join(ROOT, ".venv", "bin", "python");
const BOTHY = join(ROOT, ".venv", "bin", "bothy-notify");

export const KEY = "client-tests-only-hs256-key-0123456789abcdef";
const STARTUP_MS = 120_000;
const STOP_MS = 30_000;
const RUNNING = /bothy-notify running \(role \w+\): API http:\/\/(\S+?), gateway ws:\/\/(\S+?)\/v1\/gateway/;

export interface DaemonOptions {
  /** `[sync]` heartbeat told in hello, e.g. "1s". */
  heartbeat?: string;
  /** `[auth]` leeway, e.g. "0s". */
  leeway?: string;
  /** More TOML appended to the configuration. */
  extra?: string;
}

export class Daemon {
  readonly home: string;
  readonly configFile: string;
  readonly logFile: string;
  api = "";
  gateway = "";
  private child: ChildProcess | undefined;
  /** Events appended since this start (the daemon's consumed counter starts at 0 too). */
  private appended = 0;
  private output = "";
  private readonly options: DaemonOptions;

  constructor(options: DaemonOptions = {}) {
    this.options = options;
    this.home = mkdtempSync(join(tmpdir(), "bothy-client-test-"));
    this.configFile = join(this.home, "bothy.toml");
    this.logFile = join(this.home, "daemon.log");
    this.writeConfig("127.0.0.1:0", "127.0.0.1:0");
  }

  get apiUrl(): string {
    return `http://${this.api}`;
  }

  get gatewayUrl(): string {
    return `ws://${this.gateway}/v1/gateway`;
  }

  private writeConfig(api: string, gateway: string): void {
    const o = this.options;
    writeFileSync(
      this.configFile,
      `# Written by the client's tests (clients/typescript/test/support/daemon.ts).
[server]
api_listen = "${api}"
gateway_listen = "${gateway}"
drain_period = "2s"
dev = true

[database]
url = ""
data_dir = "pg"

[[auth.keys]]
algorithm = "HS256"
key = "${KEY}"

[auth]
leeway = "${o.leeway ?? "30s"}"

[sync]
heartbeat = "${o.heartbeat ?? "30s"}"

[notify]
default_level = "all"
coalesce_window = "0s"
mobile_delay_when_desktop_active = "0s"
poll_interval = "50ms"

[push.fake]
record_file = "pushes.jsonl"

[log]
format = "text"
level = "info"
${o.extra ?? ""}
`,
    );
  }

  /** Start and wait until it serves. */
  async start(): Promise<this> {
    if (!existsSync(BOTHY)) {
      throw new Error(`${BOTHY} is missing: run \`make lint\` (or any make target) first`);
    }
    const offset = this.output.length;
    this.appended = 0;
    const child = spawn(BOTHY, ["run", "--config", this.configFile], {
      cwd: this.home,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, BOTHY_NOTIFY_CONFIG: "" },
    });
    this.child = child;
    // Should this test process end early, the daemon drains and stops its own
    // embedded PostgreSQL (SIGTERM); a SIGKILL would leave the server behind.
    const orphaned = (): void => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
      }
    };
    process.once("exit", orphaned);
    child.once("exit", () => process.off("exit", orphaned));
    const collect = (chunk: Buffer): void => {
      this.output += chunk.toString("utf8");
    };
    child.stdout?.on("data", collect);
    child.stderr?.on("data", collect);
    const deadline = Date.now() + STARTUP_MS;
    while (Date.now() < deadline) {
      const found = RUNNING.exec(this.output.slice(offset));
      if (found !== null) {
        this.api = found[1] ?? "";
        this.gateway = found[2] ?? "";
        return this;
      }
      if (child.exitCode !== null) {
        throw new Error(`the daemon exited with ${child.exitCode} before serving:\n${this.output.slice(-4000)}`);
      }
      await sleep(25);
    }
    throw new Error(`the daemon did not serve within ${STARTUP_MS} ms:\n${this.output.slice(-4000)}`);
  }

  /** SIGTERM and wait for the exit (a graceful drain: connections get 1001). */
  async terminate(): Promise<number | null> {
    const child = this.child;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) {
      return child?.exitCode ?? null;
    }
    const exited = new Promise<number | null>((done) => child.once("exit", (code) => done(code)));
    child.kill("SIGTERM");
    const code = await Promise.race([exited, sleep(STOP_MS).then(() => "timeout" as const)]);
    if (code === "timeout") {
      child.kill("SIGKILL");
      await exited;
      this.stopLeftoverPostgres();
      throw new Error(`the daemon did not stop within ${STOP_MS} ms`);
    }
    return code;
  }

  /** Stop, then start again on the same ports and data. */
  async restart(): Promise<void> {
    await this.terminate();
    this.writeConfig(this.api, this.gateway);
    await this.start();
  }

  /** Stop for good and remove the temporary directory. */
  async stop(): Promise<void> {
    try {
      await this.terminate();
    } finally {
      this.stopLeftoverPostgres();
      writeFileSync(this.logFile, this.output);
      if (process.env.BOTHY_KEEP_TEST_DIRS === undefined) {
        rmSync(this.home, { recursive: true, force: true });
      }
    }
  }

  /** What the daemon printed so far. */
  log(): string {
    return this.output;
  }

  private stopLeftoverPostgres(): void {
    const data = join(this.home, "pg");
    if (!existsSync(join(data, "postmaster.pid"))) {
      return;
    }
    spawnSync(
      VENV_PYTHON,
      [
        "-c",
        "import os, sys\nfrom pgserver._commands import pg_ctl\n" +
          "pg_ctl(['-w', '-m', 'immediate', 'stop'], pgdata=sys.argv[1]," +
          " user='pgserver' if os.geteuid() == 0 else None, timeout=30)",
        data,
      ],
      { stdio: "ignore", timeout: 40_000 },
    );
  }

  /** A device token signed with the test key; `lifetimeS` may be negative (expired). */
  deviceToken(user: string, device: string, options: { lifetimeS?: number; platform?: string } = {}): string {
    const now = Math.floor(Date.now() / 1000);
    return sign({
      sub: user,
      did: device,
      plat: options.platform ?? "macos",
      kind: "user",
      iat: now,
      exp: now + (options.lifetimeS ?? 3600),
    });
  }

  producerToken(scope = "events:write"): string {
    const now = Math.floor(Date.now() / 1000);
    return sign({ sub: "client-tests", scope, iat: now, exp: now + 3600 });
  }

  /** `POST /v1/events`; returns the seqs. */
  async append(events: { type: string; payload: Record<string, unknown> }[]): Promise<number[]> {
    const answer = await fetch(`${this.apiUrl}/v1/events`, {
      method: "POST",
      headers: { authorization: `Bearer ${this.producerToken()}`, "content-type": "application/json" },
      body: JSON.stringify({ events }),
    });
    const body = (await answer.json()) as { seqs?: number[] };
    if (answer.status !== 200 || body.seqs === undefined) {
      throw new Error(`append answered ${answer.status}: ${JSON.stringify(body)}`);
    }
    this.appended += body.seqs.length;
    return body.seqs;
  }

  /** Wait until the consumer round has applied every event appended here. */
  async settled(): Promise<void> {
    await until("the round to apply the appended events", async () => {
      return (await this.metric("bothy_events_consumed_total")) >= this.appended;
    });
  }

  /** `POST /v1/registrations` of a fake-provider token for a phone of `user`. */
  async register(user: string, device: string, token: string): Promise<void> {
    const answer = await fetch(`${this.apiUrl}/v1/registrations`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${this.deviceToken(user, device, { platform: "ios" })}`,
        "content-type": "application/json",
      },
      body: JSON.stringify({ provider: "fake", token }),
    });
    if (answer.status !== 201 && answer.status !== 200) {
      throw new Error(`registration answered ${answer.status}: ${await answer.text()}`);
    }
  }

  /** A person who may read `threads` and follows them (level all). */
  async person(user: string, threads: string[]): Promise<void> {
    const events: { type: string; payload: Record<string, unknown> }[] = [
      { type: "user.upserted", payload: { user_id: user, kind: "human", active: true } },
    ];
    for (const thread of threads) {
      events.push(
        { type: "thread.upserted", payload: { thread_id: thread, space_id: "s1", channel_id: "c1" } },
        { type: "member.added", payload: { user_id: user, scope_id: thread } },
        { type: "thread.followed", payload: { user_id: user, thread_id: thread, level: "all" } },
      );
    }
    await this.append(events);
    // Facts first: a focus or a hint is decided with what the round has applied.
    await this.settled();
  }

  /** A message in `thread` by someone else. */
  async message(thread: string, messageId: string, threadSeq: number): Promise<void> {
    await this.append([
      {
        type: "message.created",
        payload: { thread_id: thread, message_id: messageId, thread_seq: threadSeq, author_id: "author" },
      },
    ]);
  }

  /** The value of one sample of `/metrics` (0 when absent). */
  async metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    const text = await (await fetch(`${this.apiUrl}/metrics`)).text();
    const wanted = Object.entries(labels)
      .map(([k, v]) => `${k}="${v}"`)
      .join(",");
    for (const line of text.split("\n")) {
      const [series, value] = line.split(" ");
      if (series === undefined || value === undefined) {
        continue;
      }
      const plain = wanted === "" ? name : `${name}{${wanted}}`;
      if (series === plain) {
        return Number(value);
      }
    }
    return 0;
  }
}

export function sign(claims: Record<string, unknown>): string {
  const encode = (value: object): string => Buffer.from(JSON.stringify(value)).toString("base64url");
  const body = `${encode({ alg: "HS256", typ: "JWT" })}.${encode(claims)}`;
  return `${body}.${createHmac("sha256", KEY).update(body).digest("base64url")}`;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Wait until `predicate()` holds (checked every 20 ms); fails after `timeoutMs`. */
export async function until(what: string, predicate: () => boolean | Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await sleep(20);
  }
}

/** Read a file if it exists (the fake provider's record, logs). */
export function readIfExists(path: string): string {
  return existsSync(path) ? readFileSync(path, "utf8") : "";
}
