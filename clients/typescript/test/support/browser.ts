/**
 * Headless Chromium for the tests: Debian's `chromium` driven by `puppeteer-core`
 * with a fresh profile, and a small page server on 127.0.0.1 (port 0) that
 * serves a page using the client bundled for the browser with esbuild.
 */

import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { build } from "esbuild";
import puppeteer, { type Browser } from "puppeteer-core";

export const CHROMIUM = process.env.BOTHY_CHROMIUM ?? "/usr/bin/chromium";
const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

/** Why the browser tests cannot run here, or `undefined` when they can. */
export function chromiumMissing(): string | undefined {
  return existsSync(CHROMIUM)
    ? undefined
    : `${CHROMIUM} is not installed (Debian's chromium package: make client-test installs it with apt-get where it can)`;
}

export interface Chromium {
  browser: Browser;
  close(): Promise<void>;
}

export async function launchChromium(): Promise<Chromium> {
  const profile = mkdtempSync(join(tmpdir(), "bothy-chromium-"));
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
    timeout: 60_000,
  });
  return {
    browser,
    close: async () => {
      try {
        await browser.close();
      } finally {
        rmSync(profile, { recursive: true, force: true });
      }
    },
  };
}

/** The package's dist/ bundled for a browser page: `window.Bothy`. */
export async function bundleClient(): Promise<string> {
  const result = await build({
    stdin: {
      contents: 'export * from "@bothy/notify-client";',
      resolveDir: PACKAGE,
      loader: "js",
    },
    bundle: true,
    write: false,
    format: "iife",
    globalName: "Bothy",
    platform: "browser",
    target: "es2020",
    logLevel: "silent",
  });
  const file = result.outputFiles[0];
  if (file === undefined) {
    throw new Error("esbuild wrote nothing");
  }
  return file.text;
}

const PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>a desktop app</title>
<script src="/bothy.js"></script></head>
<body><h1>A web app using @bothy/notify-client</h1><ul id="hints"></ul></body></html>`;

/** Serve the page and the bundle; returns its base URL and a way to stop. */
export async function servePage(bundle: string): Promise<{ url: string; server: Server }> {
  const server = createServer((request, response) => {
    if (request.url === "/bothy.js") {
      response.writeHead(200, { "content-type": "text/javascript; charset=utf-8" });
      response.end(bundle);
    } else if (request.url === "/" || request.url === "/index.html") {
      response.writeHead(200, { "content-type": "text/html; charset=utf-8" });
      response.end(PAGE);
    } else {
      response.writeHead(404);
      response.end();
    }
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", () => done()));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, server };
}
